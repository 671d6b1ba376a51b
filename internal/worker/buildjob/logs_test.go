package buildjob

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// A stream resumed after a drop starts again at the last line's instant
// (SinceTime is inclusive): lines passed on before are skipped, including
// repeats of one line at one instant, and nothing after is lost.
func TestLogCursorResumesWithoutRepeatsOrLoss(t *testing.T) {
	c := &logCursor{seen: map[string]int{}}
	var got []string
	stream := cursorStream(c, &got)
	const t1, t2, t3 = "2026-12-02T07:00:01.000000001Z", "2026-12-02T07:00:02.000000001Z", "2026-12-02T07:00:03Z"
	stream(t1+" a", t2+" b", t2+" b")                         // dropped after two "b" at the same instant
	stream(t2+" b", t2+" b", t2+" b", t3+" c d", "untimed x") // resumed from t2: a third "b" is new
	stream(t3+" c d", t3+" e")                                // resumed from t3
	if want := "a|b|b|b|c d|untimed x|e"; strings.Join(got, "|") != want {
		t.Fatalf("lines %q, want %q", strings.Join(got, "|"), want)
	}
}

// The cursor remembers the lines of one instant, not the log: a build
// that logs a million distinct lines leaves it holding a handful (case
// from the review of issue 14: 195 MiB of log kept 233 MiB of heap).
func TestLogCursorForgetsPassedInstants(t *testing.T) {
	c := &logCursor{seen: map[string]int{}}
	c.restart()
	base := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	for i := range 100000 {
		ts := base.Add(time.Duration(i) * time.Microsecond).Format(time.RFC3339Nano)
		if _, ok := c.line(ts + " line " + strconv.Itoa(i)); !ok {
			t.Fatalf("line %d dropped", i)
		}
	}
	if n := len(c.seen) + len(c.counted) + len(c.replay); n > 2 {
		t.Errorf("the cursor holds %d lines after 100,000 distinct ones", n)
	}
}

// cursorStream returns a func that passes one stream of raw log lines
// through c (a stream resumed: c.restart first), appending to got the
// texts it lets through.
func cursorStream(c *logCursor, got *[]string) func(lines ...string) {
	return func(lines ...string) {
		c.restart()
		for _, l := range lines {
			if text, ok := c.line(l); ok {
				*got = append(*got, text)
			}
		}
	}
}
