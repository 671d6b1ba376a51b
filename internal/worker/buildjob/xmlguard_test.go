package buildjob

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// Within its bounds the guard hands a report over as it is: markup of
// every kind, quotes and '>' inside values, CDATA holding "]]", a
// section split to hold "]]>", references in text and values.
func TestXMLGuardPassesReportsWithinItsBounds(t *testing.T) {
	gradle, err := os.ReadFile("testdata/TEST-com.acme.CalculatorTest.xml")
	if err != nil {
		t.Fatal(err)
	}
	odd := `<?xml version="1.0"?><!-- a - comment --><s a='x"y>z' b="&lt;&#65;&#x42;&quot;"><?pi x?y?>` +
		`<c><![CDATA[a]]b]]]]><![CDATA[>]]></c>text &amp; more<e/></s>`
	long := `<s>` + strings.Repeat("é", maxRunBytes/2-2) + `&amp;</s>`
	for _, in := range []string{string(gradle), odd, long} {
		g := newXMLGuard(strings.NewReader(in), MaxReportBytes)
		out, err := io.ReadAll(g)
		if err != nil || string(out) != in || g.cutText {
			t.Errorf("%.60q: handed over %.60q, %v, cut %v; want it as it is", in, out, err, g.cutText)
		}
	}
}

// Past its bounds the guard cuts a text, CDATA or attribute value run
// (after the rune or reference under way, keeping the run's end, and says
// which) and stops at markup that JUnit reports do not have or that is too
// large; past the limit the report is too large.
func TestXMLGuardCutsAndStops(t *testing.T) {
	big := strings.Repeat("é", maxRunBytes)
	cuts := []struct {
		name, in string
		attr     bool // the cut is of attribute 0 of <a>
	}{
		{"text", `<a>` + big + `</a>`, false},
		{"text ending in a reference", `<a>` + strings.Repeat("x", maxRunBytes-2) + `&amp;` + big + `</a>`, false},
		{"CDATA", `<a><![CDATA[` + big + `]]]]></a>`, false},
		{"attribute value", `<a v="` + strings.Repeat("&lt;", maxValueBytes) + `" w="1"/>`, true},
	}
	for _, tc := range cuts {
		g := newXMLGuard(strings.NewReader(tc.in), MaxReportBytes)
		dec := xml.NewDecoder(g)
		dec.Strict = true
		var text []byte
		var attrs []xml.Attr
		cutText, cutAttrs := false, uint64(0)
		for {
			g.cutText = false
			tok, err := dec.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			switch tok := tok.(type) {
			case xml.CharData:
				text = append(text, tok...)
				cutText = cutText || g.cutText
			case xml.StartElement:
				attrs, cutAttrs = tok.Copy().Attr, g.cutAttrs
			}
		}
		if tc.attr {
			if cutAttrs != 1 || len(attrs) != 2 || len(attrs[0].Value) != maxValueBytes/4 || attrs[1].Value != "1" {
				t.Errorf("%s: attributes %.80q, cut %b; want v cut at %d bytes of references, w whole", tc.name, attrs, cutAttrs, maxValueBytes)
			}
			continue
		}
		if !cutText || len(text) > maxRunBytes+utf8.UTFMax || len(text) < maxRunBytes-utf8.UTFMax || !utf8.Valid(text) {
			t.Errorf("%s: %d bytes of text (valid UTF-8 %v), cut %v; want it cut at %d bytes, on a rune", tc.name, len(text), utf8.Valid(text), cutText, maxRunBytes)
		}
	}

	many := `<a` + strings.Repeat(` b=""`, maxAttrs+1) + `/>`
	for name, in := range map[string]string{
		"a DOCTYPE":                  `<!DOCTYPE a><a/>`,
		"too many attributes":        many,
		"a long tag":                 `<a` + strings.Repeat(" ", maxMarkupBytes) + `/>`,
		"a long comment":             `<a><!--` + strings.Repeat("x", maxMarkupBytes) + `--></a>`,
		"a long PI":                  `<?a ` + strings.Repeat("x", maxMarkupBytes) + `?><a/>`,
		"a long reference in text":   `<a>&#` + strings.Repeat("0", maxRefBytes) + `65;</a>`,
		"a long reference in values": `<a b="&` + strings.Repeat("x", maxRefBytes) + `;"/>`,
	} {
		_, err := io.ReadAll(newXMLGuard(strings.NewReader(in), MaxReportBytes))
		if stop := (*stopError)(nil); !errors.As(err, &stop) {
			t.Errorf("%s: %v; want a stop", name, err)
		}
	}
	if _, err := io.ReadAll(newXMLGuard(strings.NewReader("<a>1234</a>"), 10)); !errors.Is(err, ErrReportTooLarge) {
		t.Errorf("11 bytes with a limit of 10: %v; want ErrReportTooLarge", err)
	}
}

// longRef is a reference over maxRefBytes, which the guard stops at.
var longRef = regexp.MustCompile(`&[#A-Za-z0-9_:.\-\x80-\xff]{32,}`)

// FuzzXMLGuard checks the guard against encoding/xml's Decoder alone. With
// its own bounds, on a report within them (nothing the guard stops at), it
// hands everything over. With small bounds, so that small reports are cut:
// the Decoder sees the same elements, a cut value or text is a start of
// the real one, and what the Decoder reads whole it reads whole through
// the guard too.
func FuzzXMLGuard(f *testing.F) {
	b, _ := os.ReadFile("testdata/TEST-com.acme.CalculatorTest.xml")
	f.Add(b)
	f.Add([]byte(`<s a='x"y>z' b="&lt;&#65;é"><c><![CDATA[a]]b]]]]><![CDATA[>]]></c>t &amp; é<!-- c --><?p ??></s>`))
	f.Add([]byte(`<a><![CDATA[abcdefgh]]]></a>`))
	f.Add([]byte(`<a b="abcdef&amp;&#x10FFFF;" c='éééé'>xyzxyzxyz&lt;ü</a>`))
	f.Fuzz(checkGuard)
}

// checkGuard is FuzzXMLGuard's check of one input.
func checkGuard(t *testing.T, in []byte) {
	{
		plain, plainErr := decodeAll(bytes.NewReader(in), nil)

		// Its own bounds: small reports pass as they are.
		g := newXMLGuard(bytes.NewReader(in), MaxReportBytes)
		out, err := io.ReadAll(g)
		var stop *stopError
		switch {
		case len(in) > maxValueBytes: // may be cut
		case errors.As(err, &stop):
			if plainErr == nil && !hasStopped(plain) && !longRef.Match(in) {
				t.Fatalf("stopped at %v; the Decoder reads it all", err)
			}
		case err != nil || !bytes.Equal(out, in):
			t.Fatalf("handed over %q, %v; want it as it is", out, err)
		}

		// Small bounds: cuts.
		g = newXMLGuard(bytes.NewReader(in), MaxReportBytes)
		g.runBytes, g.valueBytes = 5, 3
		guarded, err := decodeAll(g, g)
		stopped := errors.As(err, &stop)
		if plainErr == nil && !stopped && err != nil {
			t.Fatalf("through the guard: %v; the Decoder alone reads it all", err)
		}
		for i := range min(len(plain), len(guarded)) {
			p, q := plain[i], guarded[i]
			switch pt := p.tok.(type) {
			case xml.StartElement:
				qt, ok := q.tok.(xml.StartElement)
				if !ok || qt.Name != pt.Name || len(qt.Attr) != len(pt.Attr) {
					t.Fatalf("token %d: %v through the guard, %v alone", i, q.tok, p.tok)
				}
				for j, a := range qt.Attr {
					cut := q.cutAttrs&(1<<j) != 0
					if a.Name != pt.Attr[j].Name || (!cut && a.Value != pt.Attr[j].Value) || !strings.HasPrefix(pt.Attr[j].Value, a.Value) {
						t.Fatalf("token %d: attribute %v through the guard (cut %v), %v alone", i, a, cut, pt.Attr[j])
					}
				}
			case xml.CharData:
				qt, ok := q.tok.(xml.CharData)
				if !ok || (!q.cut && !bytes.Equal(qt, pt)) || !bytes.HasPrefix(pt, bytes.TrimRight(qt, "]")) {
					t.Fatalf("token %d: %q through the guard (cut %v), %q alone", i, q.tok, q.cut, p.tok)
				}
				if len(qt) > g.runBytes+utf8.UTFMax+maxRefBytes+2 {
					t.Fatalf("token %d: %d bytes of text through the guard", i, len(qt))
				}
			default:
				if !tokensEqual(p.tok, q.tok) {
					t.Fatalf("token %d: %v through the guard, %v alone", i, q.tok, p.tok)
				}
			}
		}
		if plainErr == nil && !stopped && len(guarded) != len(plain) {
			t.Fatalf("%d tokens through the guard, %d alone", len(guarded), len(plain))
		}
	}
}

type decoded struct {
	tok      xml.Token
	cut      bool
	cutAttrs uint64
}

// decodeAll is every token of r, as the parser reads them (through g, when
// not nil), and the error that ended them (nil at the end of the input).
func decodeAll(r io.Reader, g *xmlGuard) ([]decoded, error) {
	dec := xml.NewDecoder(r)
	dec.Strict = true
	var out []decoded
	for {
		if g != nil {
			g.cutText = false
		}
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		d := decoded{tok: xml.CopyToken(tok)}
		if g != nil {
			d.cut, d.cutAttrs = g.cutText, g.cutAttrs
		}
		out = append(out, d)
	}
}

// hasStopped: the tokens hold what the guard stops at (with its own
// bounds, on small reports): a directive, an element of many attributes.
func hasStopped(toks []decoded) bool {
	for _, d := range toks {
		switch t := d.tok.(type) {
		case xml.Directive:
			return true
		case xml.StartElement:
			if len(t.Attr) > maxAttrs {
				return true
			}
		}
	}
	return false
}

func tokensEqual(a, b xml.Token) bool {
	switch a := a.(type) {
	case xml.EndElement:
		b, ok := b.(xml.EndElement)
		return ok && a == b
	case xml.Comment:
		b, ok := b.(xml.Comment)
		return ok && bytes.Equal(a, b)
	case xml.ProcInst:
		b, ok := b.(xml.ProcInst)
		return ok && a.Target == b.Target && bytes.Equal(a.Inst, b.Inst)
	case xml.Directive:
		b, ok := b.(xml.Directive)
		return ok && bytes.Equal(a, b)
	}
	return false
}
