package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/platformtest"
)

// reportingOutage makes the control plane's reporting endpoints unreachable
// while down is set: the connection is cut without an answer, as when the
// control plane is gone. Model calls, the mint and the browser API go on.
type reportingOutage struct {
	down     atomic.Bool
	refusals atomic.Int64
}

func (o *reportingOutage) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o.down.Load() && strings.HasPrefix(r.URL.Path, contract.PathReportPrefix+"/") {
			o.refusals.Add(1)
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
					return
				}
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// eventually polls f until it returns "" or the timeout passes (then the
// test fails with f's last complaint).
func eventually(t *testing.T, timeout time.Duration, f func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := f()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func toolResultOf(t *testing.T, evs []contract.Event, name string) contract.ToolResult {
	t.Helper()
	id := ""
	for _, ev := range evs {
		switch ev.Type {
		case contract.EventToolUse:
			if u := platformtest.Payload[contract.ToolUse](t, ev); u.Name == name {
				id = u.ToolUseID
			}
		case contract.EventToolResult:
			if r := platformtest.Payload[contract.ToolResult](t, ev); id != "" && r.ToolUseID == id {
				return r
			}
		}
	}
	t.Fatalf("no result of a %s call in %s", name, platformtest.Summary(evs))
	return contract.ToolResult{}
}

// TestAgentFilesIssuesAndReportsSurviveAnOutage drives the real CLI: the
// agent files an issue through the talkide-issue-tracking MCP tool (stored
// once, visible in the browser API); then the reporting endpoints go down
// while the conversation goes on (a Bash turn and a second issue, which the
// tool reports as queued); when they come back, every report arrives exactly
// once and in order.
func TestAgentFilesIssuesAndReportsSurviveAnOutage(t *testing.T) {
	outage := &reportingOutage{}
	p := platformtest.Start(t, platformtest.Options{Wrap: outage.wrap})
	conv := p.NewConversation()
	stream := p.OpenStream(conv, 0)

	p.Send(conv, "file an issue: the build is broken")
	if end := stream.Until(90*time.Second, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
		t.Fatalf("issue turn ended with %s: %s", end.Type, end.Data)
	}
	if r := toolResultOf(t, stream.Events, devupstream.IssueToolName); r.IsError || r.Content != "Created issue #1: the build is broken" {
		t.Fatalf("create_issue result: %+v", r)
	}
	var list contract.IssueList
	if st := p.Do("GET", "/api/tenants/demo/envs/dev/issues", nil, &list); st != 200 || len(list.Issues) != 1 ||
		list.Issues[0].Title != "the build is broken" || list.Issues[0].ConversationID != conv || list.Issues[0].State != contract.IssueOpen {
		t.Fatalf("issues: status %d, %+v", st, list)
	}

	// The reporting endpoints go down; the conversation goes on.
	outage.down.Store(true)
	p.Send(conv, "please run `echo during-the-outage`")
	if end := stream.Until(90*time.Second, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
		t.Fatalf("bash turn ended with %s: %s", end.Type, end.Data)
	}
	n := len(stream.Events)
	p.Send(conv, "file an issue: filed while the tracker was down")
	if end := stream.Until(90*time.Second, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
		t.Fatalf("second issue turn ended with %s: %s", end.Type, end.Data)
	}
	r := toolResultOf(t, stream.Events[n:], devupstream.IssueToolName)
	if r.IsError || !strings.Contains(r.Content, "queued") || !strings.Contains(r.Content, "filed while the tracker was down") {
		t.Fatalf("create_issue during the outage: %+v; want a queued note", r)
	}
	if outage.refusals.Load() == 0 {
		t.Fatal("no report was attempted during the outage")
	}
	if st := p.Do("GET", "/api/tenants/demo/envs/dev/issues", nil, &list); st != 200 || len(list.Issues) != 1 {
		t.Fatalf("issues during the outage: %d %+v", st, list)
	}

	// Back up: everything arrives, once, in order.
	outage.down.Store(false)
	last := stream.Events[len(stream.Events)-1].ID
	eventually(t, 60*time.Second, func() string {
		var act contract.ConversationActivity
		if st := p.Do("GET", "/api/conversations/"+conv+"/activity", nil, &act); st != 200 {
			return fmt.Sprintf("activity: status %d", st)
		}
		if len(act.Activity) == 0 || act.Activity[len(act.Activity)-1].EventID < last {
			return fmt.Sprintf("activity has %d entries, want events up to %d", len(act.Activity), last)
		}
		return ""
	})
	var act contract.ConversationActivity
	p.Do("GET", "/api/conversations/"+conv+"/activity", nil, &act)
	for i, a := range act.Activity {
		if a.EventID != int64(i+1) {
			t.Fatalf("activity entry %d is event %d: every event once, in order, was expected (%+v)", i, a.EventID, act.Activity)
		}
	}
	byID := map[int64]contract.Event{}
	for _, ev := range stream.Events {
		byID[ev.ID] = ev
	}
	for _, a := range act.Activity {
		if ev, ok := byID[a.EventID]; ok && ev.Type != a.Type {
			t.Errorf("activity of event %d is %s, the event is %s", a.EventID, a.Type, ev.Type)
		}
	}
	var names []string
	for _, c := range act.ToolCalls {
		names = append(names, c.Name+":"+c.Status)
	}
	if got := strings.Join(names, " "); got != devupstream.IssueToolName+":ok Bash:ok "+devupstream.IssueToolName+":ok" {
		t.Errorf("tool calls: %s", got)
	}
	if len(act.Turns) != 3 || act.Turns[0].Outcome != contract.OutcomeCompleted || act.Turns[2].Usage.InputTokens == 0 {
		t.Errorf("turns: %+v", act.Turns)
	}
	eventually(t, 30*time.Second, func() string {
		if st := p.Do("GET", "/api/tenants/demo/envs/dev/issues", nil, &list); st != 200 || len(list.Issues) != 2 {
			return fmt.Sprintf("issues after the outage: %d %+v", st, list)
		}
		return ""
	})
	if list.Issues[0].Number != 2 || list.Issues[0].Title != "filed while the tracker was down" || list.Issues[1].Number != 1 {
		t.Errorf("issues: %+v", list.Issues)
	}
	// Another user without a grant on demo/dev sees nothing.
	p.AddUser("mallory", "tk_mallory", [2]string{"other", "dev"})
	if st, _ := p.DoAs("tk_mallory", "GET", "/api/tenants/demo/envs/dev/issues", "", ""); st != http.StatusForbidden {
		t.Errorf("issues without a grant: status %d, want 403", st)
	}
	if st, _ := p.DoAs("tk_mallory", "GET", "/api/conversations/"+conv+"/activity", "", ""); st != http.StatusNotFound {
		t.Errorf("another user's activity: status %d, want 404", st)
	}
}

// TestReportsSurviveAWorkerRestart: reports queued while the reporting
// endpoints are down survive a restart of the worker in between (the event
// log and the outbox are on the session volume) and arrive exactly once, in
// order, with the issue the agent filed during the outage.
func TestReportsSurviveAWorkerRestart(t *testing.T) {
	outage := &reportingOutage{}
	p := platformtest.StartRestartable(t, platformtest.Options{Wrap: outage.wrap})
	conv := p.NewConversation()
	stream := p.OpenStream(conv, 0)

	outage.down.Store(true)
	p.Send(conv, "please run `echo before-the-restart`")
	if end := stream.Until(90*time.Second, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
		t.Fatalf("bash turn ended with %s: %s", end.Type, end.Data)
	}
	p.Send(conv, "file an issue: queued across a restart")
	if end := stream.Until(90*time.Second, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
		t.Fatalf("issue turn ended with %s: %s", end.Type, end.Data)
	}
	if r := toolResultOf(t, stream.Events, devupstream.IssueToolName); !strings.Contains(r.Content, "queued") {
		t.Fatalf("create_issue during the outage: %+v", r)
	}

	p.RestartWorker()
	outage.down.Store(false)
	// A turn after the restart: its reports queue behind the old ones.
	stream = p.OpenStream(conv, stream.Events[len(stream.Events)-1].ID)
	p.Send(conv, "please run `echo after-the-restart`")
	end := stream.Until(90*time.Second, platformtest.TurnEnd)
	if end.Type != contract.EventTurnCompleted {
		t.Fatalf("turn after the restart ended with %s: %s", end.Type, end.Data)
	}
	eventually(t, 60*time.Second, func() string {
		var act contract.ConversationActivity
		if st := p.Do("GET", "/api/conversations/"+conv+"/activity", nil, &act); st != 200 {
			return fmt.Sprintf("activity: status %d", st)
		}
		if len(act.Activity) == 0 || act.Activity[len(act.Activity)-1].EventID < end.ID {
			return fmt.Sprintf("activity has %d entries, want events up to %d", len(act.Activity), end.ID)
		}
		return ""
	})
	var act contract.ConversationActivity
	p.Do("GET", "/api/conversations/"+conv+"/activity", nil, &act)
	for i, a := range act.Activity {
		if a.EventID != int64(i+1) {
			t.Fatalf("activity entry %d is event %d: every event once, in order, was expected", i, a.EventID)
		}
	}
	if len(act.Turns) != 3 {
		t.Errorf("turns: %+v", act.Turns)
	}
	var list contract.IssueList
	eventually(t, 30*time.Second, func() string {
		if st := p.Do("GET", "/api/tenants/demo/envs/dev/issues", nil, &list); st != 200 || len(list.Issues) != 1 {
			return fmt.Sprintf("issues: %d %+v", st, list)
		}
		return ""
	})
	if list.Issues[0].Title != "queued across a restart" {
		t.Errorf("issue: %+v", list.Issues[0])
	}
}
