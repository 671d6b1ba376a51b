package buildjob

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// A line is whole only with its newline: the end of a stream in the
// middle of a line gives what was read of it, marked not whole, with the
// stream's error (issue 27, fault 4: the fragment was passed on as a line).
func TestReadLineTellsAFragment(t *testing.T) {
	long := strings.Repeat("x", MaxLogLine+10)
	cut := errors.New("cut")
	for _, tc := range []struct {
		name string
		in   io.Reader
		want []string // each read: text, "+" if whole, then "!" and the error at the end
	}{
		{"whole lines", strings.NewReader("a\r\nb\n\n"), []string{"a+", "b+", "+", "!EOF"}},
		{"cleanly ended mid-line", strings.NewReader("a\nbc"), []string{"a+", "bc!EOF"}},
		{"dropped mid-line", io.MultiReader(strings.NewReader("a\nbc"), iotest.ErrReader(cut)), []string{"a+", "bc!cut"}},
		{"a long line, cut", strings.NewReader(long + "\nz\n"), []string{long[:MaxLogLine] + "+", "z+", "!EOF"}},
		{"a long fragment", strings.NewReader(long), []string{long[:MaxLogLine] + "!EOF"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := bufio.NewReaderSize(tc.in, 16) // lines longer than the buffer
			var got []string
			for {
				s, whole, err := readLine(r)
				if whole {
					s += "+"
				}
				if err != nil {
					got = append(got, s+"!"+err.Error())
					break
				}
				got = append(got, s)
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("reads %.80q, want %.80q", got, tc.want)
			}
		})
	}
}

// The kubelet takes SinceTime in whole seconds: a resumed stream replays
// the lines of that second from its start. Those before the instant it
// resumed at were passed on already and are skipped (issue 27: they were
// passed on again).
func TestLogCursorSkipsTheResumedSecondsEarlierLines(t *testing.T) {
	c := &logCursor{seen: map[string]int{}}
	var got []string
	stream := cursorStream(c, &got)
	const t1, t2, t3 = "2026-12-02T07:00:01.1Z", "2026-12-02T07:00:01.2Z", "2026-12-02T07:00:01.3Z"
	stream(t1+" a", t2+" b")          // cut after b
	stream(t1+" a", t2+" b", t3+" c") // from 07:00:01
	if want := "a|b|c"; strings.Join(got, "|") != want {
		t.Fatalf("lines %q, want %q", strings.Join(got, "|"), want)
	}
}
