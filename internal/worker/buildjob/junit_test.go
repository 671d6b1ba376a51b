package buildjob

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// A Gradle report (JUnit XML: one suite per test class) gives every case
// with its status, and the failure's message and stack for the agent.
func TestParseJUnitGradleReport(t *testing.T) {
	f, err := os.Open("testdata/TEST-com.acme.CalculatorTest.xml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r Results
	if err := r.ParseJUnit(f); err != nil {
		t.Fatal(err)
	}
	if r.Tests != 4 || r.Failures != 1 || r.Errors != 1 || r.Skipped != 1 || len(r.Suites) != 1 || r.Suites[0].Name != "com.acme.CalculatorTest" {
		t.Fatalf("results %+v", r)
	}
	want := map[string]string{"adds": CasePassed, "divides": CaseFailed, "parses": CaseError, "rounds": CaseSkipped}
	for _, c := range r.Suites[0].Cases {
		if want[c.Name] != c.Status {
			t.Errorf("%s: %s, want %s", c.Name, c.Status, want[c.Name])
		}
	}
	failed := r.Failed()
	if len(failed) != 2 || failed[0].Message != "expected:<4> but was:<5>" || failed[0].Type != "java.lang.AssertionError" ||
		!strings.Contains(failed[0].Detail, "CalculatorTest.java:17") || failed[1].Message != `For input string: "x"` {
		t.Fatalf("failed cases %+v", failed)
	}
}

// Counts come from the cases, not from the report's own attributes, and
// several reports (and a <testsuites> wrapper) add up.
func TestParseJUnitCountsCases(t *testing.T) {
	var r Results
	lying := `<testsuite name="A" tests="100" failures="0"><testcase classname="A" name="x"><failure message="m"/></testcase></testsuite>`
	wrapped := `<testsuites><testsuite name="B"><testcase classname="B" name="y"/></testsuite><testsuite name="C"><testcase classname="C" name="z"/></testsuite></testsuites>`
	for _, doc := range []string{lying, wrapped} {
		if err := r.ParseJUnit(strings.NewReader(doc)); err != nil {
			t.Fatal(err)
		}
	}
	if r.Tests != 3 || r.Failures != 1 || len(r.Suites) != 3 || r.Suites[0].Tests != 1 {
		t.Fatalf("results %+v", r)
	}
}

// Reports are the build's, so the agent's: bounded in size, in cases kept
// and in what one failure carries; not XML, or no suite, is an error; a
// refused report adds nothing.
func TestParseJUnitBounds(t *testing.T) {
	var r Results
	huge := "<testsuite name=\"A\">" + strings.Repeat("<testcase classname=\"A\" name=\"x\"/>", MaxReportBytes/30) + "</testsuite>"
	if err := r.ParseJUnit(strings.NewReader(huge)); !errors.Is(err, ErrReportTooLarge) {
		t.Errorf("a report over the limit: %v", err)
	}
	for _, bad := range []string{"", "not xml", "<html><body/></html>", "<testsuite name=\"a\"><testcase>", "<!DOCTYPE x [<!ENTITY a \"b\">]><testsuite>&a;</testsuite>"} {
		var r Results
		if err := r.ParseJUnit(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: accepted", bad)
		}
		if r.Tests != 0 || len(r.Suites) != 0 {
			t.Errorf("%q: a refused report added %+v", bad, r)
		}
	}
	var many bytes.Buffer
	many.WriteString("<testsuite name=\"M\">")
	for i := range MaxCases + 5 {
		fmt.Fprintf(&many, "<testcase classname=\"M\" name=\"t%d\"/>", i)
	}
	many.WriteString("</testsuite>")
	r = Results{}
	if err := r.ParseJUnit(&many); err != nil {
		t.Fatal(err)
	}
	if r.Tests != MaxCases+5 || len(r.Suites[0].Cases) != MaxCases {
		t.Errorf("%d tests, %d kept; want all counted, %d kept", r.Tests, len(r.Suites[0].Cases), MaxCases)
	}
	long := "<testsuite name=\"L\"><testcase classname=\"L\" name=\"x\"><failure message=\"" + strings.Repeat("é", MaxMessage) + "\">" +
		strings.Repeat("ü", MaxDetail) + "</failure></testcase></testsuite>"
	r = Results{}
	if err := r.ParseJUnit(strings.NewReader(long)); err != nil {
		t.Fatal(err)
	}
	c := r.Suites[0].Cases[0]
	if len(c.Message) > MaxMessage || len(c.Detail) > MaxDetail || !c.Truncated || !utf8Valid(c.Message) || !utf8Valid(c.Detail) {
		t.Errorf("a long failure: message %d bytes, detail %d, truncated %v", len(c.Message), len(c.Detail), c.Truncated)
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

// FuzzParseJUnit: any input is parsed or refused, never a panic, and what
// is kept respects the bounds.
func FuzzParseJUnit(f *testing.F) {
	b, _ := os.ReadFile("testdata/TEST-com.acme.CalculatorTest.xml")
	f.Add(b)
	f.Add([]byte(`<testsuites><testsuite name="B"><testcase classname="B" name="y"><error/></testcase></testsuite></testsuites>`))
	f.Fuzz(func(t *testing.T, in []byte) {
		var r Results
		if err := r.ParseJUnit(bytes.NewReader(in)); err != nil {
			return
		}
		kept := 0
		for _, s := range r.Suites {
			kept += len(s.Cases)
			for _, c := range s.Cases {
				if len(c.Detail) > MaxDetail || len(c.Message) > MaxMessage {
					t.Fatalf("case over its bounds: %+v", c)
				}
			}
		}
		if kept > MaxCases || r.Failures+r.Errors+r.Skipped > r.Tests {
			t.Fatalf("results %+v", r)
		}
	})
}

// A report that reaches a bound of its shape is read up to there: the
// cases before it count, the results say where it stopped, and that is no
// error, so the build's results stand (issue 26). One that reaches it
// before any suite is refused, as is one that breaks off (not XML).
func TestParseJUnitStopsAtABoundKeepingTheCounts(t *testing.T) {
	head := `<testsuite name="S"><testcase classname="S" name="a"/><testcase classname="S" name="b"><failure message="m"/></testcase>`
	for what, tail := range map[string]string{
		"nested more than 32 deep":         strings.Repeat("<x>", MaxDepth),
		"more than 32 attributes":          `<x` + strings.Repeat(` a=""`, 40) + `/>`,
		"a <!DOCTYPE>":                     `<!DOCTYPE x>`,
		"over 64 KiB":                      `<!--` + strings.Repeat("-x", 40<<10) + `-->`,
		"a character reference over 32":    `<testcase name="&#` + strings.Repeat("0", 40) + `65;"/>`,
		"nested more than 32 deep (mid)":   `<testcase name="c">` + strings.Repeat("<x>", MaxDepth),
		"a <!DOCTYPE> (more after it too)": `<!DOCTYPE x><testcase name="d"/></testsuite>`,
	} {
		var r Results
		err := r.ParseJUnit(strings.NewReader(head + tail))
		want := strings.TrimSuffix(strings.TrimSuffix(what, " (mid)"), " (more after it too)")
		if err != nil || r.Tests != 2 || r.Failures != 1 || len(r.Suites) != 1 || len(r.Suites[0].Cases) != 2 ||
			len(r.Truncated) != 1 || !strings.Contains(r.Truncated[0], want) || !strings.HasPrefix(r.Truncated[0], "report: read up to line 1") {
			t.Errorf("%s: %v, %d tests, notes %q; want the 2 before it counted and a note naming it", what, err, r.Tests, r.Truncated)
		}
	}
	for _, bad := range []string{strings.Repeat("<x>", MaxDepth+1) + head, "<!DOCTYPE x>" + head, head + "<testcase>"} {
		var r Results
		r.ParseJUnit(strings.NewReader(`<testsuite name="E"><testcase name="e"/></testsuite>`))
		if err := r.ParseJUnit(strings.NewReader(bad)); err == nil || r.Tests != 1 || len(r.Suites) != 1 || len(r.Truncated) != 0 {
			t.Errorf("%.40q: %v, %d tests, %d suites, notes %q; want it refused, adding nothing", bad, err, r.Tests, len(r.Suites), r.Truncated)
		}
	}
	// Notes of stopped reports are bounded too.
	var r Results
	for range 3 * maxNotes {
		if err := r.ParseJUnit(strings.NewReader(head + "<!DOCTYPE x>")); err != nil {
			t.Fatal(err)
		}
	}
	if r.Tests != 3*maxNotes*2 || len(r.Truncated) != maxNotes+1 || r.Truncated[maxNotes] != "and more reports stopped early" {
		t.Errorf("%d tests, %d notes; want all counted, %d notes", r.Tests, len(r.Truncated), maxNotes+1)
	}
}

// Past what the results keep (MaxCases, MaxSuites, MaxKeptBytes) cases
// are counted and not listed, and the results say so, once for each.
func TestParseJUnitNotesWhatItDoesNotList(t *testing.T) {
	var b strings.Builder
	b.WriteString("<testsuites>")
	for i := range MaxSuites + 3 {
		fmt.Fprintf(&b, `<testsuite name="s%d"><testcase name="a"/><testcase name="b"/><testcase name="c"/></testsuite>`, i)
	}
	b.WriteString("</testsuites>")
	var r Results
	if err := r.ParseJUnit(strings.NewReader(b.String())); err != nil {
		t.Fatal(err)
	}
	want := []string{"more than 10000 test cases: those past it are counted, not listed",
		"more than 4096 test suites: the cases of those past it are counted, not listed"}
	if r.Tests != 3*(MaxSuites+3) || len(r.Suites) != MaxSuites || r.kept != MaxCases || !slices.Equal(r.Truncated, want) {
		t.Errorf("%d tests, %d suites, %d cases listed, notes %q", r.Tests, len(r.Suites), r.kept, r.Truncated)
	}

	b.Reset()
	b.WriteString(`<testsuite name="K">`)
	trace := strings.Repeat("at com.acme.K.t(K.java:1)\n", MaxDetail/20)
	for i := range 1000 { // about 11 MiB of names, messages and traces
		fmt.Fprintf(&b, `<testcase classname="%s" name="t%d"><failure message="%s" type="T">%s</failure></testcase>`,
			strings.Repeat("k", MaxName), i, strings.Repeat("m", MaxMessage), trace)
	}
	b.WriteString(`</testsuite>`)
	r = Results{}
	if err := r.ParseJUnit(strings.NewReader(b.String())); err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, c := range r.Failed() {
		kept += len(c.Class) + len(c.Name) + len(c.Type) + len(c.Message) + len(c.Detail)
	}
	if r.Failures != 1000 || kept > MaxKeptBytes || kept < MaxKeptBytes-11<<10 || len(r.Truncated) != 1 || !strings.HasPrefix(r.Truncated[0], "over 4 MiB of names and messages") {
		t.Errorf("%d failures, %d bytes kept, notes %q; want all counted, %d bytes kept at most", r.Failures, kept, r.Truncated, MaxKeptBytes)
	}
}

// An ordinary report with a long system-out and a long stack trace, as a
// test that prints much and fails deep down writes: every case counted,
// nothing noted as left out, the failure kept with its trace cut at
// MaxDetail and marked so, and its long message cut at MaxMessage.
func TestParseJUnitReadsLongOutputWhole(t *testing.T) {
	trace := "java.lang.AssertionError: expected:<1> but was:<2>\n" + strings.Repeat("\tat com.acme.Deep.recurse(Deep.java:7)\n", 5000)
	msg := "expected:&lt;" + strings.Repeat("é", 3000) + "&gt; but was:&lt;x&gt;"
	in := `<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="com.acme.Deep" tests="3" skipped="0" failures="1" errors="0" time="1.5">
  <properties/>
  <testcase name="shallow" classname="com.acme.Deep" time="0.001"/>
  <testcase name="deep" classname="com.acme.Deep" time="1.2">
    <failure message="` + msg + `" type="java.lang.AssertionError">` + strings.ReplaceAll(strings.ReplaceAll(trace, "<", "&lt;"), ">", "&gt;") + `</failure>
  </testcase>
  <testcase name="after" classname="com.acme.Deep" time="0.3"/>
  <system-out><![CDATA[` + strings.Repeat("line of output\n", 100000) + `]]></system-out>
  <system-err><![CDATA[]]></system-err>
</testsuite>
`
	var r Results
	if err := r.ParseJUnit(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if r.Tests != 3 || r.Failures != 1 || len(r.Truncated) != 0 || len(r.Suites) != 1 || r.Suites[0].Seconds != 1.5 || len(r.Suites[0].Cases) != 3 {
		t.Fatalf("results %+v", r)
	}
	c := r.Failed()[0]
	if c.Name != "deep" || c.Seconds != 1.2 || c.Type != "java.lang.AssertionError" || !c.Truncated ||
		c.Detail != clip(trace, MaxDetail) || !strings.HasPrefix(c.Message, "expected:<éé") || len(c.Message) > MaxMessage || len(c.Message) < MaxMessage-1 || !utf8Valid(c.Message) {
		t.Errorf("failure %s: type %q, %d bytes of message, %d of detail, truncated %v", c.Name, c.Type, len(c.Message), len(c.Detail), c.Truncated)
	}
}

// parseReport refuses a report over its limit (ReadResults gives each the
// room left of MaxReportTotal), adding nothing.
func TestParseReportLimit(t *testing.T) {
	var r Results
	doc := `<testsuite name="S"><testcase name="a"/></testsuite>`
	if _, err := r.parseReport(strings.NewReader(doc), "x", int64(len(doc))-1); !errors.Is(err, ErrReportTooLarge) || r.Tests != 0 || len(r.Suites) != 0 {
		t.Errorf("a report over its limit: %v, %+v", err, r)
	}
	if n, err := r.parseReport(strings.NewReader(doc), "x", int64(len(doc))); err != nil || n != int64(len(doc)) || r.Tests != 1 {
		t.Errorf("a report at its limit: %v, %d bytes read, %+v", err, n, r)
	}
}
