package buildjob

import (
	"bufio"
	"fmt"
	"io"
	"unicode/utf8"
)

// Bounds of what encoding/xml's Decoder is handed of one token of a report
// (xmlGuard). The Decoder buffers each token whole before returning it,
// and a StartElement's attributes cost some 50 bytes each however short
// they are written, so these bound its memory however a report is shaped.
const (
	// maxMarkupBytes bounds a tag (its name and attributes, values as
	// handed over), a comment or a processing instruction, in bytes; a
	// larger one stops the read.
	maxMarkupBytes = 64 << 10
	// maxAttrs bounds the attributes of one element; more stop the read.
	// (Gradle writes at most eight, on <testsuite>.)
	maxAttrs = 32
	// maxValueBytes bounds an attribute value as handed over, in bytes;
	// the rest of it is dropped. More than MaxMessage and MaxName, so that
	// a value cut here is cut again, and marked so, where it is kept.
	maxValueBytes = 4 << 10
	// maxRunBytes bounds one text or CDATA run as handed over, in bytes;
	// the rest of it is dropped (a test's system-out can be megabytes;
	// of a failure's trace MaxDetail is kept).
	maxRunBytes = 16 << 10
	// maxRefBytes bounds one character or entity reference (&#x41;,
	// &amp;), in bytes; a longer one stops the read.
	maxRefBytes = 32
)

// stopError says which bound of what a report may hold stopped its read.
type stopError struct{ why string }

func (e *stopError) Error() string { return "JUnit report: " + e.why }

// guardState is where in the markup the next byte falls.
type guardState uint8

const (
	inText      guardState = iota // character data
	inOpen                        // after '<'
	inTag                         // a start or end tag, outside attribute values
	inValue                       // a quoted attribute value
	inBang                        // after "<!"
	inBangDash                    // after "<!-"
	inComment                     // after "<!--"
	inCDATAOpen                   // the "CDATA[" of "<![CDATA["
	inCDATA                       // a CDATA section's text
	inPI                          // a processing instruction, after "<?"
)

// xmlGuard is what encoding/xml's Decoder reads a report through. It
// follows the markup one byte ahead of the Decoder, as the Decoder reads
// it, and keeps each token the Decoder will buffer bounded:
//
//   - of a text or CDATA run it hands over maxRunBytes, of an attribute
//     value maxValueBytes, then finishes the rune or character reference
//     under way and drops the rest up to the run's end, which it hands
//     over (a CDATA section's "]]>" as well); cutText and cutAttrs record
//     the cut, so that what is kept of it is marked truncated;
//   - a tag, comment or processing instruction over maxMarkupBytes, an
//     element with more than maxAttrs attributes, a reference over
//     maxRefBytes, and any <!DOCTYPE> or other declaration end the read
//     with a *stopError (JUnit reports have none of them);
//   - over limit bytes of input it ends the read with ErrReportTooLarge.
//
// It is an io.ByteReader, so the Decoder takes its bytes one at a time
// and buffers none ahead: what the guard has handed over is what the
// Decoder has read. On input the Decoder refuses, the guard's idea of the
// markup can part from the Decoder's only from where the Decoder stops
// with a syntax error.
type xmlGuard struct {
	r     *bufio.Reader
	lr    io.LimitedReader
	limit int64 // bytes the report may have
	// runBytes and valueBytes are maxRunBytes and maxValueBytes (tests
	// make them small).
	runBytes, valueBytes int
	n                    int64  // bytes of the report read
	err                  error  // what ends the read, returned from then on
	pend                 string // bytes to hand over before reading more

	state  guardState
	quote  byte // the quote that ends the attribute value read
	markup int  // bytes of the current tag, comment or processing instruction
	attrs  int  // attribute values begun in the current tag
	run    int  // bytes handed over of the current text, CDATA or attribute value
	ref    int  // bytes of the reference under way in a run; 0: none
	cont   int  // bytes of the last rune handed over past a run's bound
	drop   bool // dropping the rest of the current run
	b0, b1 byte // the bytes before, for the ends of comments, CDATA and PIs

	// cutText is set when bytes of a text or CDATA run are dropped; the
	// parser clears it before each token.
	cutText bool
	// cutAttrs has bit i set when the current tag's attribute i was cut
	// (maxAttrs fits); it is cleared at each '<'.
	cutAttrs uint64
}

func newXMLGuard(in io.Reader, limit int64) *xmlGuard {
	g := &xmlGuard{limit: limit, runBytes: maxRunBytes, valueBytes: maxValueBytes}
	g.lr = io.LimitedReader{R: in, N: limit + 1}
	g.r = bufio.NewReaderSize(&g.lr, 32<<10)
	return g
}

// bytesRead is how much of the report was read from its reader (at most
// the limit and one byte, with what was buffered ahead).
func (g *xmlGuard) bytesRead() int64 { return g.limit + 1 - g.lr.N }

// Read is ReadByte for each byte of b (the Decoder reads by ReadByte).
func (g *xmlGuard) Read(b []byte) (int, error) {
	for i := range b {
		c, err := g.ReadByte()
		if err != nil {
			return i, err
		}
		b[i] = c
	}
	return len(b), nil
}

// ReadByte hands the Decoder its next byte.
func (g *xmlGuard) ReadByte() (byte, error) {
	for g.err == nil {
		if g.pend != "" {
			b := g.pend[0]
			g.pend = g.pend[1:]
			return b, nil
		}
		b, err := g.r.ReadByte()
		if err != nil {
			g.err = err
			break
		}
		if g.n++; g.n > g.limit {
			g.err = ErrReportTooLarge
			break
		}
		pass, err := g.step(b)
		if err != nil {
			g.err = err
			break
		}
		if pass {
			return b, nil
		}
	}
	return 0, g.err
}

// step moves the guard over b and says whether b is handed over.
func (g *xmlGuard) step(b byte) (bool, error) {
	switch g.state {
	case inText:
		if b == '<' {
			g.state, g.markup, g.attrs, g.cutAttrs = inOpen, 1, 0, 0
			return true, nil
		}
		return g.runByte(b, g.runBytes, true), g.refErr()
	case inOpen:
		switch b {
		case '?':
			g.state, g.b0 = inPI, 0
		case '!':
			g.state = inBang
		default: // '/' of an end tag, or the first byte of a name
			g.state = inTag
		}
	case inTag:
		switch b {
		case '>':
			g.toText()
		case '"', '\'':
			if g.attrs++; g.attrs > maxAttrs {
				return false, &stopError{fmt.Sprintf("an element with more than %d attributes", maxAttrs)}
			}
			g.state, g.quote = inValue, b
			g.run, g.ref, g.cont, g.drop = 0, 0, 0, false
		}
	case inValue:
		if b == g.quote {
			g.state = inTag
			break
		}
		if !g.runByte(b, g.valueBytes, true) {
			g.cutAttrs |= 1 << (g.attrs - 1)
			return false, g.refErr()
		}
	case inBang:
		switch b {
		case '-':
			g.state = inBangDash
		case '[':
			g.state, g.run = inCDATAOpen, 0
		default:
			return false, &stopError{"a <!DOCTYPE> or other declaration"}
		}
	case inBangDash:
		g.state, g.b0, g.b1 = inComment, 0, 0
	case inComment:
		if g.b0 == '-' && g.b1 == '-' { // b is '>', or the Decoder refuses it
			g.toText()
			break
		}
		g.b0, g.b1 = g.b1, b
	case inCDATAOpen:
		if g.run++; g.run == len("CDATA[") {
			g.toText()
			g.state, g.b0, g.b1 = inCDATA, 0, 0
		}
	case inCDATA:
		if g.b0 == ']' && g.b1 == ']' && b == '>' {
			dropped := g.drop
			g.toText()
			if dropped { // the "]]" went with the rest
				g.pend = "]]>"
				return false, nil
			}
			return true, nil
		}
		g.b0, g.b1 = g.b1, b
		if !g.runByte(b, g.runBytes, false) {
			g.cutText = true
			return false, nil
		}
		return true, nil
	case inPI:
		if g.b0 == '?' && b == '>' {
			g.toText()
			break
		}
		g.b0 = b
	}
	// b is markup (a value's byte counts with its tag).
	if g.markup++; g.markup > maxMarkupBytes {
		return false, &stopError{fmt.Sprintf("a tag, comment or processing instruction over %d KiB", maxMarkupBytes>>10)}
	}
	return true, g.refErr()
}

// toText begins a text run.
func (g *xmlGuard) toText() {
	g.state = inText
	g.run, g.ref, g.cont, g.drop = 0, 0, 0, false
}

// runByte says whether b, of a text, CDATA or attribute value run, is
// handed over: up to limit bytes, then the rune or (where refs) the
// reference under way, then none up to the run's end. It sets cutText for
// text; the caller marks a cut attribute.
func (g *xmlGuard) runByte(b byte, limit int, refs bool) bool {
	if g.drop {
		return false
	}
	if g.ref > 0 {
		switch {
		case b == ';':
			g.ref = 0
		case isRefByte(b):
			g.ref++ // refErr stops a long one
		default:
			g.ref = 0 // not a reference the Decoder takes
		}
		g.run++
		return true
	}
	if g.run < limit {
		g.run++
		if refs && b == '&' {
			g.ref = 1
		}
		return true
	}
	if b&0xC0 == 0x80 && g.cont < utf8.UTFMax-1 { // the rest of a rune begun within the bound
		g.cont++
		return true
	}
	g.drop = true
	if g.state == inText {
		g.cutText = true
	}
	return false
}

func (g *xmlGuard) refErr() error {
	if g.ref > maxRefBytes {
		return &stopError{fmt.Sprintf("a character reference over %d bytes", maxRefBytes)}
	}
	return nil
}

// isRefByte: b can be in a reference after its '&' (a name, or '#' and
// digits), as the Decoder reads one.
func isRefByte(b byte) bool {
	return 'A' <= b && b <= 'Z' || 'a' <= b && b <= 'z' || '0' <= b && b <= '9' ||
		b == '_' || b == ':' || b == '.' || b == '-' || b == '#' || b >= utf8.RuneSelf
}
