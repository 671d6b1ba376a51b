package streamjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
)

func TestParseObservedTurn(t *testing.T) {
	f, err := os.Open("testdata/turn.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := NewReader(f)
	var got []string
	var msgs []Message
	for {
		line, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		m, err := Parse(line)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.messageType())
		msgs = append(msgs, m)
	}
	want := "system/init assistant user system/api_retry command_lifecycle assistant result"
	if strings.Join(got, " ") != want {
		t.Fatalf("types: got %q, want %q", strings.Join(got, " "), want)
	}
	init := msgs[0].(*SystemInit)
	if init.SessionID != "fd6014dd-47de-421a-bff7-11b79c7b1b5e" || init.ClaudeCodeVersion != "2.1.332" {
		t.Errorf("init: got %+v", init)
	}
	tu := msgs[1].(*Assistant).Message.Blocks()[0]
	if tu.Type != "tool_use" || tu.Name != "Bash" || !json.Valid(tu.Input) {
		t.Errorf("tool_use: got %+v", tu)
	}
	tr := msgs[2].(*User).Message.Blocks()[0]
	if tr.ResultText() != "hi" || tr.ToolUseID != "toolu_fake_0001" {
		t.Errorf("tool_result: got %+v", tr)
	}
	retry := msgs[3].(*APIRetry)
	if retry.Attempt != 1 || *retry.ErrorStatus != 429 || retry.RetryDelayMS != 2299 {
		t.Errorf("api_retry: got %+v", retry)
	}
	res := msgs[6].(*Result)
	if res.IsError || res.Result != "done" || res.Usage.InputTokens != 24164 || res.NumTurns != 2 || res.APIErrorStatus != nil {
		t.Errorf("result: got %+v", res)
	}
}

func TestResultTextForms(t *testing.T) {
	for raw, want := range map[string]string{
		`"plain"`: "plain",
		`[{"type":"text","text":"a"},{"type":"image"},{"type":"text","text":"b"}]`: "a\nb",
		``: "",
	} {
		b := ContentBlock{Type: "tool_result", Content: json.RawMessage(raw)}
		if got := b.ResultText(); got != want {
			t.Errorf("ResultText(%s) = %q, want %q", raw, got, want)
		}
	}
}

func TestReaderLongLines(t *testing.T) {
	big := strings.Repeat("x", 3<<20) // far past bufio.Scanner's 64 KB default
	in := "{\"a\":\"" + big + "\"}\n\n  \n{\"b\":1}"
	r := NewReader(strings.NewReader(in))
	l1, err := r.Next()
	if err != nil || len(l1) != len(big)+8 {
		t.Fatalf("long line: len %d err %v", len(l1), err)
	}
	l2, err := r.Next()
	if err != nil || string(l2) != `{"b":1}` {
		t.Fatalf("last unterminated line: got %q, %v", l2, err)
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("end: got %v, want EOF", err)
	}
}

func TestReaderLineTooLongIsSkipped(t *testing.T) {
	r := NewReader(strings.NewReader(strings.Repeat("y", 1000) + "\n{\"ok\":true}\n"))
	r.max = 100
	if _, err := r.Next(); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("got %v, want ErrLineTooLong", err)
	}
	l, err := r.Next()
	if err != nil || string(l) != `{"ok":true}` {
		t.Fatalf("after the long line: got %q, %v", l, err)
	}
}

func TestEncoders(t *testing.T) {
	for _, line := range [][]byte{
		UserInput("hi \"there\"\nnext", "0000aaaa-1111-4222-8333-444455556666"),
		ControlRequestLine("r1", "interrupt", nil),
		ControlSuccess("r2", map[string]any{"behavior": "allow"}),
		ControlError("r3", "no"),
	} {
		if !bytes.HasSuffix(line, []byte("\n")) || bytes.Count(line, []byte("\n")) != 1 || !json.Valid(line) {
			t.Errorf("not one JSON line: %q", line)
		}
	}
}

func FuzzParse(f *testing.F) {
	data, _ := os.ReadFile("testdata/turn.jsonl")
	for l := range bytes.Lines(data) {
		f.Add(bytes.TrimSpace(l))
	}
	f.Add([]byte(`{"type":"assistant","message":{"content":"x"}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		m, err := Parse(line)
		if err != nil {
			return
		}
		switch v := m.(type) {
		case *Assistant:
			_ = v.Message.Blocks()
		case *User:
			for _, b := range v.Message.Blocks() {
				_ = b.ResultText()
			}
		case *ControlRequest:
			_ = v.Subtype()
		}
	})
}

// TestParseObservedSubagentTurn parses a turn of CLI 2.1.332 in which the
// main agent ran a sub-agent (Agent tool, run_in_background false) whose Bash
// call needed permission: the sub-agent's lines carry parent_tool_use_id and
// agent_id, task_started links the agent id to the Agent call, and the
// can_use_tool request names the agent.
func TestParseObservedSubagentTurn(t *testing.T) {
	b, err := os.ReadFile("testdata/subagent.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var msgs []Message
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		m, err := Parse(line)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.messageType())
		msgs = append(msgs, m)
	}
	// The bare "system" lines are task_progress and task_updated (Unknown).
	want := "system/init assistant system/task_started user system assistant control_request user system system/task_notification user assistant result"
	if strings.Join(got, " ") != want {
		t.Fatalf("types: got %q, want %q", strings.Join(got, " "), want)
	}
	agentCall := msgs[1].(*Assistant).Message.Blocks()[0]
	if agentCall.Name != "Agent" || msgs[1].(*Assistant).ParentToolUseID != nil {
		t.Fatalf("main agent's call: got %+v", msgs[1])
	}
	started := msgs[2].(*TaskStarted)
	if started.ToolUseID != agentCall.ID || started.TaskType != "local_agent" || started.TaskID == "" || started.IsBackgrounded {
		t.Errorf("task_started: got %+v, want the Agent call %s", started, agentCall.ID)
	}
	prompt := msgs[3].(*User)
	if prompt.ParentToolUseID == nil || *prompt.ParentToolUseID != agentCall.ID || prompt.AgentID != started.TaskID {
		t.Errorf("sub-agent prompt: got parent %v, agent %q", prompt.ParentToolUseID, prompt.AgentID)
	}
	inner := msgs[5].(*Assistant)
	bash := inner.Message.Blocks()[0]
	if bash.Name != "Bash" || inner.ParentToolUseID == nil || *inner.ParentToolUseID != agentCall.ID || inner.AgentID != started.TaskID {
		t.Errorf("sub-agent's Bash call: got %+v (parent %v, agent %q)", bash, inner.ParentToolUseID, inner.AgentID)
	}
	ask := msgs[6].(*ControlRequest)
	var req struct {
		ToolUseID string `json:"tool_use_id"`
		AgentID   string `json:"agent_id"`
	}
	if ask.Subtype() != "can_use_tool" || json.Unmarshal(ask.Request, &req) != nil || req.ToolUseID != bash.ID || req.AgentID != started.TaskID {
		t.Errorf("can_use_tool: got %s", ask.Request)
	}
	res := msgs[7].(*User)
	if r := res.Message.Blocks()[0]; r.ToolUseID != bash.ID || r.ResultText() != "sub-x" || res.ParentToolUseID == nil {
		t.Errorf("sub-agent's tool_result: got %+v", res)
	}
	done := msgs[9].(*TaskNotification)
	if done.TaskID != started.TaskID || done.ToolUseID != agentCall.ID || done.Status != "completed" {
		t.Errorf("task_notification: got %+v", done)
	}
	outer := msgs[10].(*User)
	if r := outer.Message.Blocks()[0]; r.ToolUseID != agentCall.ID || !strings.Contains(r.ResultText(), "sub-x") || outer.ParentToolUseID != nil {
		t.Errorf("Agent tool_result: got %+v", outer)
	}
}

// TestHasLineOnlyForAWholeLineAtHand: HasLine is true only when Next would
// return a line without reading: not for a partial line, nor for empty
// lines Next would skip before blocking.
func TestHasLineOnlyForAWholeLineAtHand(t *testing.T) {
	pr, pw := io.Pipe()
	r := NewReader(pr)
	go func() { pw.Write([]byte("{\"a\":1}\n{\"b\":2}\n  \n\n{\"c\"")) }()
	first, err := r.Next()
	if err != nil || string(first) != `{"a":1}` {
		t.Fatalf("first line: %q, %v", first, err)
	}
	if !r.HasLine() {
		t.Fatal("HasLine false with a whole line buffered")
	}
	if second, err := r.Next(); err != nil || string(second) != `{"b":2}` {
		t.Fatalf("second line: %q, %v", second, err)
	}
	if r.HasLine() {
		t.Fatal("HasLine true with only empty lines and a partial one buffered")
	}
	go func() { pw.Write([]byte(":3}\n")); pw.Close() }()
	if third, err := r.Next(); err != nil || string(third) != `{"c":3}` {
		t.Fatalf("third line: %q, %v", third, err)
	}
	if r.HasLine() {
		t.Fatal("HasLine true at the end")
	}
}
