package buildjob

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Results are a build's test results, from its JUnit XML reports (Gradle
// writes one file per test class, build/test-results/<task>/TEST-*.xml;
// ReportsDir). The counts are over every suite.
type Results struct {
	Tests    int     `json:"tests"`
	Failures int     `json:"failures"`
	Errors   int     `json:"errors"`
	Skipped  int     `json:"skipped"`
	Suites   []Suite `json:"suites"`

	kept int // cases kept in Suites, at most MaxCases
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

// Limits of what a report may hold: a build is the project's code, and so
// its reports are the agent's to write.
const (
	MaxReportBytes = 16 << 20 // one report file
	MaxCases       = 10000    // cases kept over all suites
	MaxDetail      = 8 << 10  // a failure's detail
	MaxMessage     = 2 << 10  // a failure's message
)

// ErrReportTooLarge is returned by ParseJUnit for a report over
// MaxReportBytes.
var ErrReportTooLarge = errors.New("JUnit report larger than 16 MiB")

type xmlFault struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Body    string `xml:",chardata"`
}

type xmlCase struct {
	Class   string    `xml:"classname,attr"`
	Name    string    `xml:"name,attr"`
	Time    float64   `xml:"time,attr"`
	Failure *xmlFault `xml:"failure"`
	Error   *xmlFault `xml:"error"`
	Skipped *struct{} `xml:"skipped"`
}

type xmlSuite struct {
	Name  string    `xml:"name,attr"`
	Time  float64   `xml:"time,attr"`
	Cases []xmlCase `xml:"testcase"`
}

// ParseJUnit reads one JUnit XML report (a <testsuite>, or <testsuites>
// holding several) into r, counting from the cases themselves, not the
// report's own totals. It returns ErrReportTooLarge past MaxReportBytes
// and a wrapped xml error for a report that is not JUnit XML; r keeps
// what earlier reports added.
func (r *Results) ParseJUnit(in io.Reader) error {
	lr := &io.LimitedReader{R: in, N: MaxReportBytes + 1}
	dec := xml.NewDecoder(lr)
	dec.Strict = true
	var suites []xmlSuite
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if lr.N <= 0 {
				return ErrReportTooLarge
			}
			return fmt.Errorf("JUnit report: %w", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Local != "testsuite" {
			continue
		}
		var s xmlSuite
		if err := dec.DecodeElement(&s, &se); err != nil {
			if lr.N <= 0 {
				return ErrReportTooLarge
			}
			return fmt.Errorf("JUnit report: %w", err)
		}
		suites = append(suites, s)
	}
	if lr.N <= 0 {
		return ErrReportTooLarge
	}
	if len(suites) == 0 {
		return errors.New("JUnit report: no <testsuite>")
	}
	for _, s := range suites {
		out := Suite{Name: clip(s.Name, 512), Seconds: s.Time}
		for _, c := range s.Cases {
			keep := r.kept < MaxCases
			kc := Case{Seconds: c.Time, Status: CasePassed}
			if keep {
				kc.Class, kc.Name = clip(c.Class, 512), clip(c.Name, 512)
			}
			var f *xmlFault
			switch {
			case c.Failure != nil:
				kc.Status, f = CaseFailed, c.Failure
			case c.Error != nil:
				kc.Status, f = CaseError, c.Error
			case c.Skipped != nil:
				kc.Status = CaseSkipped
			}
			if f != nil && keep {
				kc.Type, kc.Message = clip(f.Type, 512), clip(f.Message, MaxMessage)
				detail := strings.TrimSpace(f.Body)
				kc.Detail = clip(detail, MaxDetail)
				kc.Truncated = len(kc.Detail) < len(detail) || len(kc.Message) < len(f.Message)
			}
			out.Tests++
			r.Tests++
			switch kc.Status {
			case CaseFailed:
				out.Failures++
				r.Failures++
			case CaseError:
				out.Errors++
				r.Errors++
			case CaseSkipped:
				out.Skipped++
				r.Skipped++
			}
			if keep {
				out.Cases = append(out.Cases, kc)
				r.kept++
			}
		}
		r.Suites = append(r.Suites, out)
	}
	return nil
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
