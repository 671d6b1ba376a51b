package buildjob

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Results are a build's test results, from its JUnit XML reports (Gradle
// writes one file per test class, build/test-results/<task>/TEST-*.xml;
// ReportsDir). The counts are over every suite, listed or not.
type Results struct {
	Tests    int     `json:"tests"`
	Failures int     `json:"failures"`
	Errors   int     `json:"errors"`
	Skipped  int     `json:"skipped"`
	Suites   []Suite `json:"suites"`
	// Truncated says what the results leave out, one note for each bound
	// reached: cases counted but not listed (past MaxCases, MaxSuites or
	// MaxKeptBytes), and reports whose reading stopped early (their cases
	// before that are counted). Empty when nothing was left out.
	Truncated []string `json:"truncated,omitempty"`

	kept      int      // cases kept in Suites, at most MaxCases
	keptBytes int      // text kept in Suites, at most MaxKeptBytes
	full      bool     // MaxKeptBytes reached: no more is kept
	noted     noteKind // the bounds Truncated has a note for
}

// Suite is one <testsuite>: a test class, for Gradle.
type Suite struct {
	Name     string  `json:"name"`
	Tests    int     `json:"tests"`
	Failures int     `json:"failures"`
	Errors   int     `json:"errors"`
	Skipped  int     `json:"skipped"`
	Seconds  float64 `json:"seconds"`
	Cases    []Case  `json:"cases"`
}

// Case statuses.
const (
	CasePassed  = "passed"
	CaseFailed  = "failed"  // an assertion failed (<failure>)
	CaseError   = "error"   // the test threw (<error>)
	CaseSkipped = "skipped" // <skipped>
)

// Case is one <testcase>. Message and Detail are what the agent needs to
// act on a failure: the assertion's message and the start of its stack
// trace (Detail is cut at MaxDetail bytes, on a UTF-8 boundary, with
// Truncated set).
type Case struct {
	Class     string  `json:"class"`
	Name      string  `json:"name"`
	Status    string  `json:"status"`
	Seconds   float64 `json:"seconds"`
	Type      string  `json:"type,omitempty"`
	Message   string  `json:"message,omitempty"`
	Detail    string  `json:"detail,omitempty"`
	Truncated bool    `json:"truncated,omitempty"`
}

// Limits of what a report may hold and of what the worker keeps of it: a
// build is the project's code, and so its reports are the agent's to
// write. A report is read as a stream of tokens, never whole, and what is
// kept is bounded over all of a build's reports, so the worker's memory
// is bounded however the reports are shaped (reports crafted within the
// byte bounds grew it 20-fold when they were read whole). Past a bound on what is kept,
// cases are counted and not listed; past a bound on a report's shape
// (MaxDepth, and xmlGuard's on one token) its reading stops. Either way
// Results.Truncated says so.
const (
	// MaxReportBytes bounds one report file, in bytes; a larger one is
	// refused (ErrReportTooLarge).
	MaxReportBytes = 16 << 20
	// MaxCases bounds the cases Results lists over all its suites;
	// further cases are counted, not listed.
	MaxCases = 10000
	// MaxSuites bounds the suites Results lists; the cases of further
	// suites are counted, not listed. (Gradle writes one report file, so
	// one suite, per test class, and at most maxReportFiles are read.)
	MaxSuites = 4096
	// MaxKeptBytes bounds the text Results keeps over all its suites and
	// cases, in bytes: names, types, messages and details. Cases past it
	// are counted, not listed.
	MaxKeptBytes = 4 << 20
	// MaxName bounds a suite's, class's, test's or failure type's name as
	// kept, in bytes.
	MaxName = 512
	// MaxDetail bounds a failure's detail (its stack trace) as kept, in
	// bytes.
	MaxDetail = 8 << 10
	// MaxMessage bounds a failure's message as kept, in bytes.
	MaxMessage = 2 << 10
	// MaxDepth bounds how deeply a report's elements nest, in elements
	// (Gradle's nest three deep); a deeper element stops its reading.
	MaxDepth = 32
	// maxNotes bounds the notes of Results.Truncated on reports whose
	// reading stopped; one more says there were more.
	maxNotes = 16
)

// ErrReportTooLarge is returned by ParseJUnit for a report over
// MaxReportBytes.
var ErrReportTooLarge = errors.New("JUnit report larger than 16 MiB")

// ParseJUnit reads one JUnit XML report (a <testsuite>, or <testsuites>
// holding several) into r, counting from the cases themselves, not the
// report's own totals. A report that reaches a bound of its shape
// (MaxDepth; xmlGuard's on one tag, comment or reference; a <!DOCTYPE>) is
// read up to there: r keeps the cases before it and says so in
// r.Truncated, and that is no error. It returns ErrReportTooLarge past
// MaxReportBytes and a wrapped error for a report that is not JUnit XML,
// and then r keeps only what earlier reports added.
func (r *Results) ParseJUnit(in io.Reader) error {
	_, err := r.parseReport(in, "report", MaxReportBytes)
	return err
}

// parseReport is ParseJUnit of the report called name (for the notes),
// refused past limit bytes. It returns the bytes it read of in.
func (r *Results) parseReport(in io.Reader, name string, limit int64) (read int64, err error) {
	g := newXMLGuard(in, limit)
	before := *r
	p := junitParser{r: r, g: g, dec: xml.NewDecoder(g), suite: -1}
	p.dec.Strict = true
	err = p.run()
	read = g.bytesRead()
	var stop *stopError
	switch {
	case err == nil && p.suites > 0:
		return read, nil
	case errors.As(err, &stop) && p.suites > 0:
		line, _ := p.dec.InputPos()
		r.noteStop(fmt.Sprintf("%s: read up to line %d, where it has %s; its test cases before that are counted", name, line, stop.why))
		return read, nil
	case errors.Is(err, ErrReportTooLarge):
	case err == nil:
		err = errors.New("JUnit report: no <testsuite>")
	case stop != nil:
		err = fmt.Errorf("JUnit report: %s before any <testsuite>", stop.why)
	default:
		err = fmt.Errorf("JUnit report: %w", err)
	}
	// Refused: r as it was, without what this report added.
	clear(r.Suites[len(before.Suites):])
	*r = before
	return read, err
}

// junitParser reads one report's tokens into r, keeping of each open
// element only its kind (at most MaxDepth of them) and of the one test
// case open what r may keep of it.
type junitParser struct {
	r       *Results
	g       *xmlGuard
	dec     *xml.Decoder
	depth   int
	kinds   [MaxDepth]elemKind
	suites  int  // <testsuite>s begun
	suite   int  // the open suite's index in r.Suites; -1: none, or not kept
	inSuite bool // a suite is open
	c       openCase
}

type elemKind uint8

const (
	elemOther elemKind = iota
	elemSuite
	elemCase
	elemFault // the <failure> or <error> whose text is the case's detail
)

// openCase is what is kept of the <testcase> being read.
type openCase struct {
	keep                     bool // its names and failure are kept
	class, name              string
	seconds                  float64
	failed, errored, skipped bool
	fault, faultIsFailure    bool // a <failure> or <error> is recorded
	typ, message             string
	messageCut               bool
	detail                   []byte // the fault's text, from its first non-space, up to MaxDetail+1 bytes
	more                     bool   // text past detail, other than spaces, or cut by the guard
}

func (p *junitParser) run() error {
	for {
		p.g.cutText = false
		tok, err := p.dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if p.depth == MaxDepth {
				return &stopError{fmt.Sprintf("elements nested more than %d deep", MaxDepth)}
			}
			if err := p.start(t); err != nil {
				return err
			}
		case xml.EndElement:
			p.end()
		case xml.CharData:
			if p.depth > 0 && p.kinds[p.depth-1] == elemFault {
				p.c.addText(t, p.g.cutText)
			}
		}
	}
}

// start reads an element's start: as when reports were read whole, a
// <testsuite> anywhere but in another, a <testcase> in a suite, its
// <failure>, <error> and <skipped>; attributes by their local names, the
// last of a name counting.
func (p *junitParser) start(t xml.StartElement) error {
	parent := elemOther
	if p.depth > 0 {
		parent = p.kinds[p.depth-1]
	}
	kind := elemOther
	switch local := t.Name.Local; {
	case local == "testsuite" && !p.inSuite:
		kind = elemSuite
		if err := p.openSuite(t.Attr); err != nil {
			return err
		}
	case local == "testcase" && parent == elemSuite:
		kind = elemCase
		if err := p.openCase(t.Attr); err != nil {
			return err
		}
	case (local == "failure" || local == "error") && parent == elemCase:
		if p.recordFault(local == "failure", t.Attr) {
			kind = elemFault
		}
	case local == "skipped" && parent == elemCase:
		p.c.skipped = true
	}
	p.kinds[p.depth] = kind
	p.depth++
	return nil
}

func (p *junitParser) end() {
	p.depth--
	switch p.kinds[p.depth] {
	case elemSuite:
		p.inSuite, p.suite = false, -1
	case elemCase:
		p.closeCase()
	}
}

func (p *junitParser) openSuite(attrs []xml.Attr) error {
	r := p.r
	var name string
	var seconds float64
	for _, a := range attrs {
		switch a.Name.Local {
		case "name":
			name = a.Value
		case "time":
			var err error
			if seconds, err = parseSeconds(a.Value); err != nil {
				return err
			}
		}
	}
	p.suites++
	p.inSuite, p.suite = true, -1
	name = clip(name, MaxName)
	switch {
	case len(r.Suites) >= MaxSuites:
		r.note(noteSuites, fmt.Sprintf("more than %d test suites: the cases of those past it are counted, not listed", MaxSuites))
	case !r.fits(len(name)):
	default:
		r.keptBytes += len(name)
		r.Suites = append(r.Suites, Suite{Name: name, Seconds: seconds})
		p.suite = len(r.Suites) - 1
	}
	return nil
}

func (p *junitParser) openCase(attrs []xml.Attr) error {
	r := p.r
	c := &p.c
	*c = openCase{detail: c.detail[:0]}
	c.keep = p.suite >= 0 && r.kept < MaxCases && !r.full
	for _, a := range attrs {
		switch a.Name.Local {
		case "classname":
			c.class = a.Value
		case "name":
			c.name = a.Value
		case "time":
			var err error
			if c.seconds, err = parseSeconds(a.Value); err != nil {
				return err
			}
		}
	}
	if c.keep {
		c.class, c.name = clip(c.class, MaxName), clip(c.name, MaxName)
	} else {
		c.class, c.name = "", ""
	}
	return nil
}

// recordFault reads a <failure> or <error> of the open case and says
// whether it is the one kept: its first <failure>, else its first <error>.
func (p *junitParser) recordFault(failure bool, attrs []xml.Attr) bool {
	c := &p.c
	if failure {
		c.failed = true
	} else {
		c.errored = true
	}
	if c.fault && (c.faultIsFailure || !failure) {
		return false
	}
	c.fault, c.faultIsFailure = true, failure
	c.typ, c.message, c.messageCut, c.detail, c.more = "", "", false, c.detail[:0], false
	if !c.keep {
		return false
	}
	for i, a := range attrs {
		switch a.Name.Local {
		case "type":
			c.typ = clip(a.Value, MaxName)
		case "message":
			c.message = clip(a.Value, MaxMessage)
			c.messageCut = len(c.message) < len(a.Value) || p.g.cutAttrs&(1<<i) != 0
		}
	}
	return true
}

// addText adds a run of the kept fault's text: its detail is the text
// with the spaces at either end trimmed, cut at MaxDetail.
func (c *openCase) addText(text []byte, cut bool) {
	if len(c.detail) == 0 {
		text = bytes.TrimLeftFunc(text, unicode.IsSpace)
	}
	if room := MaxDetail + 1 - len(c.detail); len(text) > room {
		if len(bytes.TrimSpace(text[room:])) > 0 {
			c.more = true
		}
		text = text[:room]
	}
	c.detail = append(c.detail, text...)
	c.more = c.more || cut
}

func (p *junitParser) closeCase() {
	r, c := p.r, &p.c
	kc := Case{Class: c.class, Name: c.name, Status: CasePassed, Seconds: c.seconds}
	switch {
	case c.failed:
		kc.Status = CaseFailed
	case c.errored:
		kc.Status = CaseError
	case c.skipped:
		kc.Status = CaseSkipped
	}
	var s *Suite
	if p.suite >= 0 {
		s = &r.Suites[p.suite]
		s.Tests++
	}
	r.Tests++
	switch kc.Status {
	case CaseFailed:
		r.Failures++
		if s != nil {
			s.Failures++
		}
	case CaseError:
		r.Errors++
		if s != nil {
			s.Errors++
		}
	case CaseSkipped:
		r.Skipped++
		if s != nil {
			s.Skipped++
		}
	}
	if s == nil {
		return
	}
	if !c.keep {
		if r.kept >= MaxCases { // else MaxKeptBytes, noted when reached
			r.note(noteCases, fmt.Sprintf("more than %d test cases: those past it are counted, not listed", MaxCases))
		}
		return
	}
	if c.fault {
		detail := c.detail
		if !c.more {
			detail = bytes.TrimRightFunc(detail, unicode.IsSpace)
		}
		kc.Type, kc.Message, kc.Detail = c.typ, c.message, clipBytes(detail, MaxDetail)
		kc.Truncated = c.messageCut || c.more || len(kc.Detail) < len(detail)
	}
	size := len(kc.Class) + len(kc.Name) + len(kc.Type) + len(kc.Message) + len(kc.Detail)
	if !r.fits(size) {
		return
	}
	r.keptBytes += size
	s.Cases = append(s.Cases, kc)
	r.kept++
}

// parseSeconds reads a time attribute as encoding/xml's Unmarshal did:
// empty is 0, anything else must be a number.
func parseSeconds(v string) (float64, error) {
	if v == "" {
		return 0, nil
	}
	return strconv.ParseFloat(strings.TrimSpace(v), 64)
}

// noteKind names the bounds on what is kept, each noted once.
type noteKind uint8

const (
	noteCases noteKind = 1 << iota
	noteSuites
	noteKept
	noteMoreStops
)

// fits says whether n more bytes of text may be kept; when not, nothing
// more is, and Truncated says so.
func (r *Results) fits(n int) bool {
	if !r.full && r.keptBytes+n <= MaxKeptBytes {
		return true
	}
	r.full = true
	r.note(noteKept, fmt.Sprintf("over %d MiB of names and messages: the test cases past it are counted, not listed", MaxKeptBytes>>20))
	return false
}

func (r *Results) note(k noteKind, s string) {
	if r.noted&k == 0 {
		r.noted |= k
		r.Truncated = append(r.Truncated, s)
	}
}

// noteStop notes a report whose reading stopped, up to maxNotes of them.
func (r *Results) noteStop(s string) {
	if len(r.Truncated) < maxNotes {
		r.Truncated = append(r.Truncated, s)
		return
	}
	r.note(noteMoreStops, "and more reports stopped early")
}

// Failed returns the failed and erroneous cases, in report order.
func (r *Results) Failed() []Case {
	var out []Case
	for _, s := range r.Suites {
		for _, c := range s.Cases {
			if c.Status == CaseFailed || c.Status == CaseError {
				out = append(out, c)
			}
		}
	}
	return out
}

// clip cuts s to at most n bytes on a UTF-8 boundary, as a copy: a
// substring would keep the whole of a large report's text alive.
func clip(s string, n int) string {
	if len(s) <= n {
		return strings.Clone(s)
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return strings.Clone(s[:n])
}

// clipBytes is clip of a []byte, as a string.
func clipBytes(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return string(b[:n])
}
