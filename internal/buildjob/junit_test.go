package buildjob

import (
	"bytes"
	"errors"
	"fmt"
	"os"
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
