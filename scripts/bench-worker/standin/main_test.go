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
