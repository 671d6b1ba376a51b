package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/worker/streamjson"
)

// TestTurnParsesAsTheCLIs checks that what the stand-in prints is what the
// harness reads from the CLI: the answer to a control request, and a turn
// of system/init, assistant texts carrying their write time, and a result.
func TestTurnParsesAsTheCLIs(t *testing.T) {
	in := string(streamjson.ControlRequestLine("init-1", "initialize", nil)) +
		string(streamjson.UserInput("bench lines=4 gap=1ms", "u1"))
	var out bytes.Buffer
	before := time.Now()
	if err := serve(strings.NewReader(in), &out, "sess-1", "/w"); err != nil {
		t.Fatal(err)
	}
	r := streamjson.NewReader(&out)
	var kinds []string
	texts := 0
	for {
		line, err := r.Next()
		if err != nil {
			break
		}
		m, err := streamjson.Parse(line)
		if err != nil {
			t.Fatalf("parse %s: %v", line, err)
		}
		switch m := m.(type) {
		case *streamjson.ControlResponse:
			kinds = append(kinds, "control_response")
		case *streamjson.SystemInit:
			kinds = append(kinds, "init")
			if m.SessionID != "sess-1" {
				t.Errorf("init session %q, want sess-1", m.SessionID)
			}
		case *streamjson.Assistant:
			for _, b := range m.Message.Blocks() {
				at, ok := SentAt(b.Text)
				if !ok || at.Before(before) || at.After(time.Now()) {
					t.Errorf("assistant text %q: no write time of this run", b.Text)
				}
				texts++
			}
		case *streamjson.Result:
			kinds = append(kinds, "result")
			if m.IsError || m.Subtype != "success" {
				t.Errorf("result %+v, want success", m)
			}
		default:
			t.Errorf("unexpected line %s", line)
		}
	}
	if got, want := strings.Join(kinds, ","), "control_response,init,result"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	if texts != 4 {
		t.Errorf("got %d assistant texts, want 4", texts)
	}
}

// countingWriter counts the writes it is given.
type countingWriter struct {
	bytes.Buffer
	writes int
}

func (w *countingWriter) Write(b []byte) (int, error) {
	w.writes++
	return w.Buffer.Write(b)
}

// TestBurstIsOneWrite: with burst=1 a turn's assistant lines and its
// result reach stdout in one write (after system/init's own), so a reader
// finds them all at hand at once.
func TestBurstIsOneWrite(t *testing.T) {
	for _, tc := range []struct {
		script string
		writes int
	}{
		{"bench lines=5", 1 + 1 + 5 + 1},
		{"bench lines=5 burst=1", 1 + 1 + 1},
	} {
		in := string(streamjson.ControlRequestLine("init-1", "initialize", nil)) + string(streamjson.UserInput(tc.script, "u1"))
		var out countingWriter
		if err := serve(strings.NewReader(in), &out, "sess-1", "/w"); err != nil {
			t.Fatal(err)
		}
		if out.writes != tc.writes {
			t.Errorf("%q: %d writes, want %d", tc.script, out.writes, tc.writes)
		}
		if n := strings.Count(out.String(), "\n"); n != 1+1+5+1 {
			t.Errorf("%q: %d lines, want 8", tc.script, n)
		}
	}
}
