package buildjob

import (
	"strings"
	"testing"
)

// A stream resumed after a drop starts again at the last line's instant
// (SinceTime is inclusive): lines passed on before are skipped, including
// repeats of one line at one instant, and nothing after is lost.
func TestLogCursorResumesWithoutRepeatsOrLoss(t *testing.T) {
	c := &logCursor{seen: map[string]int{}}
	var got []string
	stream := func(lines ...string) {
		c.restart()
		for _, l := range lines {
			if text, ok := c.line(l); ok {
				got = append(got, text)
			}
		}
	}
	const t1, t2, t3 = "2026-12-02T07:00:01.000000001Z", "2026-12-02T07:00:02.000000001Z", "2026-12-02T07:00:03Z"
	stream(t1+" a", t2+" b", t2+" b")                         // dropped after two "b" at the same instant
	stream(t2+" b", t2+" b", t2+" b", t3+" c d", "untimed x") // resumed from t2: a third "b" is new
	stream(t3+" c d", t3+" e")                                // resumed from t3
	if want := "a|b|b|b|c d|untimed x|e"; strings.Join(got, "|") != want {
		t.Fatalf("lines %q, want %q", strings.Join(got, "|"), want)
	}
}
