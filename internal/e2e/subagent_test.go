package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/worker"
	"github.com/talkide/talkide/internal/worker/harness"
)

// toolEvent is a tool_use or tool_result event of the stream, with whether
// its JSON names a parent at all.
type toolEvent struct {
	typ       contract.EventType
	id        int64
	toolUseID string
	name      string // tool_use only
	parent    string
	hasParent bool // the payload holds the parent_tool_use_id key
	input     string
	content   string
	isError   bool
}

func (e toolEvent) String() string {
	return fmt.Sprintf("%d:%s(%s %s parent=%q)", e.id, e.typ, e.toolUseID, e.name, e.parent)
}

// toolEvents returns the tool_use and tool_result events among evs, in order.
func toolEvents(t *testing.T, evs []contract.Event) []toolEvent {
	t.Helper()
	var out []toolEvent
	for _, ev := range evs {
		var keys map[string]json.RawMessage
		_ = json.Unmarshal(ev.Data, &keys)
		_, has := keys["parent_tool_use_id"]
		switch ev.Type {
		case contract.EventToolUse:
			u := platformtest.Payload[contract.ToolUse](t, ev)
			out = append(out, toolEvent{typ: ev.Type, id: ev.ID, toolUseID: u.ToolUseID, name: u.Name, parent: u.ParentToolUseID, hasParent: has, input: string(u.Input)})
		case contract.EventToolResult:
			r := platformtest.Payload[contract.ToolResult](t, ev)
			out = append(out, toolEvent{typ: ev.Type, id: ev.ID, toolUseID: r.ToolUseID, parent: r.ParentToolUseID, hasParent: has, content: r.Content, isError: r.IsError})
		}
	}
	return out
}

// checkSubagentCalls checks the tool events of a turn in which the main
// agent ran cmd through a sub-agent: tool_use (Agent), tool_use (Bash,
// parent = the Agent call), tool_result (Bash, same parent), tool_result
// (Agent), each call announced once, the main agent's events without a
// parent key. It returns the Agent and the Bash call ids.
func checkSubagentCalls(t *testing.T, evs []contract.Event, cmd, output string) (agent, bash string) {
	t.Helper()
	got := toolEvents(t, evs)
	if len(got) != 4 {
		t.Fatalf("tool events: got %v, want 4 (Agent use, Bash use, Bash result, Agent result); events: %s", got, platformtest.Summary(evs))
	}
	use, inner, innerRes, res := got[0], got[1], got[2], got[3]
	agent, bash = use.toolUseID, inner.toolUseID
	var task struct{ Prompt string }
	_ = json.Unmarshal([]byte(use.input), &task)
	if use.typ != contract.EventToolUse || use.name != devupstream.SubagentToolName || use.hasParent || !strings.Contains(task.Prompt, cmd) {
		t.Errorf("first tool event: got %v (input %s), want the main agent's %s call without parent_tool_use_id", use, use.input, devupstream.SubagentToolName)
	}
	var in struct{ Command string }
	_ = json.Unmarshal([]byte(inner.input), &in)
	if inner.typ != contract.EventToolUse || inner.name != "Bash" || inner.parent != agent || in.Command != cmd {
		t.Errorf("second tool event: got %v (input %s), want the sub-agent's Bash call of %q under %s", inner, inner.input, cmd, agent)
	}
	if innerRes.typ != contract.EventToolResult || innerRes.toolUseID != bash || innerRes.parent != agent || innerRes.isError || !strings.Contains(innerRes.content, output) {
		t.Errorf("third tool event: got %v (content %q), want the Bash result holding %q under %s", innerRes, innerRes.content, output, agent)
	}
	if res.typ != contract.EventToolResult || res.toolUseID != agent || res.hasParent || res.isError || !strings.Contains(res.content, output) {
		t.Errorf("fourth tool event: got %v (content %q), want the %s call's result holding %q without parent_tool_use_id", res, res.content, devupstream.SubagentToolName, output)
	}
	return agent, bash
}

// finalText returns the last assistant_text of evs.
func finalText(t *testing.T, evs []contract.Event) (text string, id int64) {
	t.Helper()
	for _, ev := range evs {
		if ev.Type == contract.EventAssistantText {
			text, id = platformtest.Payload[contract.AssistantText](t, ev).Text, ev.ID
		}
	}
	return text, id
}

// TestSubagentToolCallsReachTheStream runs a turn in which the real CLI
// starts a sub-agent (its Agent tool) that runs a Bash command: the
// sub-agent's call reaches the browser stream as tool_use and tool_result
// events linked to the Agent call, between the Agent call's own events, and
// the main agent's answer quotes the sub-agent's output. The sub-agent's own
// text is not an assistant_text event (its report is the Agent call's
// result).
func TestSubagentToolCallsReachTheStream(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	conv := p.NewConversation()
	stream := p.OpenStream(conv, 0)
	p.Send(conv, "use a subagent to run `echo sub-x`")
	end := stream.Until(90*time.Second, platformtest.TurnEnd)
	if end.Type != contract.EventTurnCompleted {
		t.Fatalf("turn ended with %s: %s", end.Type, end.Data)
	}
	checkSubagentCalls(t, stream.Events, "echo sub-x", "sub-x")
	text, textID := finalText(t, stream.Events)
	last := toolEvents(t, stream.Events)[3]
	if !strings.Contains(text, "subagent reported") || !strings.Contains(text, "sub-x") || textID < last.id {
		t.Errorf("final text %q (event %d): want the main agent quoting the sub-agent's report after the Agent result (event %d)", text, textID, last.id)
	}
	for _, ev := range stream.Events {
		if ev.Type == contract.EventAssistantText && strings.Contains(platformtest.Payload[contract.AssistantText](t, ev).Text, "I'll run that.") {
			t.Errorf("the sub-agent's own text reached the stream: %s", ev.Data)
		}
	}
}

// TestSubagentPermissionRequestFollowsItsToolUse runs the sub-agent turn
// with the permission policy "ask" and a command the CLI asks about (a
// redirection): the permission_requested event of the sub-agent's Bash call
// comes after a tool_use event of the same tool_use_id (linked to the Agent
// call), the answer through the browser API lets the call run, and no call
// is announced twice.
func TestSubagentPermissionRequestFollowsItsToolUse(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{Worker: func(c *worker.Config) { c.PermissionPolicy = harness.PolicyAsk }})
	conv := p.NewConversation()
	stream := p.OpenStream(conv, 0)
	const cmd = "echo sub-x > out.txt && cat out.txt"
	p.Send(conv, "use a subagent to run `"+cmd+"`")
	var asked []contract.PermissionRequested
	for {
		ev := stream.Until(90*time.Second, func(ev contract.Event) bool {
			return ev.Type == contract.EventPermissionRequested || platformtest.TurnEnd(ev)
		})
		if ev.Type != contract.EventPermissionRequested {
			if ev.Type != contract.EventTurnCompleted {
				t.Fatalf("turn ended with %s: %s", ev.Type, ev.Data)
			}
			break
		}
		pr := platformtest.Payload[contract.PermissionRequested](t, ev)
		seen := false
		for _, u := range toolEvents(t, stream.Events) {
			seen = seen || u.typ == contract.EventToolUse && u.toolUseID == pr.ToolUseID
		}
		if !seen {
			t.Errorf("permission_requested %d for %s %s: no tool_use event of that call before it; events: %s", ev.ID, pr.ToolName, pr.ToolUseID, platformtest.Summary(stream.Events))
		}
		asked = append(asked, pr)
		var res contract.PermissionResolved
		if st := p.Do("POST", "/api/conversations/"+conv+"/permissions/"+pr.RequestID, contract.PermissionAnswer{Behavior: "allow"}, &res); st != http.StatusOK || res.Behavior != "allow" {
			t.Fatalf("answer permission request: status %d, %+v", st, res)
		}
	}
	agent, bash := checkSubagentCalls(t, stream.Events, cmd, "sub-x")
	var askedBash bool
	for _, pr := range asked {
		askedBash = askedBash || pr.ToolUseID == bash && pr.ToolName == "Bash"
	}
	if !askedBash {
		t.Errorf("permission requests %+v: want one for the sub-agent's Bash call %s (under %s)", asked, bash, agent)
	}
	if text, _ := finalText(t, stream.Events); !strings.Contains(text, "sub-x") {
		t.Errorf("final text %q does not quote the sub-agent's output", text)
	}
}
