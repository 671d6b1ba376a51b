package e2e

import (
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/platformtest"
)

// TestBrowserStreamSurvivesControlPlaneRestart restarts the control plane
// while a turn streams; the browser reconnects with Last-Event-ID and gets
// every event exactly once, in order, as the worker's log holds them.
func TestBrowserStreamSurvivesControlPlaneRestart(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	conv := p.NewConversation()
	slow := 150 * time.Millisecond
	p.Upstream.Script(
		devupstream.Response{Content: []devupstream.ContentBlock{devupstream.ToolUse("Bash", map[string]any{"command": "echo step-one"})}, StopReason: "tool_use", EventDelay: slow},
		devupstream.Response{Content: []devupstream.ContentBlock{devupstream.ToolUse("Bash", map[string]any{"command": "echo step-two"})}, StopReason: "tool_use", EventDelay: slow},
		devupstream.Response{Content: []devupstream.ContentBlock{devupstream.Text("both steps ran")}, StopReason: "end_turn", EventDelay: slow},
	)
	first := p.OpenStream(conv, 0)
	p.Send(conv, "do the two steps")
	first.Until(60*time.Second, func(ev contract.Event) bool { return ev.Type == contract.EventToolResult })

	p.RestartControlPlane()
	p.WaitControlPlane()

	last := first.Events[len(first.Events)-1].ID
	second := p.OpenStream(conv, last)
	second.Until(60*time.Second, platformtest.TurnEnd)
	got := append(append([]contract.Event(nil), first.Events...), second.Events...)
	for i, ev := range got {
		if ev.ID != int64(i+1) {
			t.Fatalf("browser got ids %s: want 1..%d once each", platformtest.Summary(got), len(got))
		}
	}
	if got[len(got)-1].Type != contract.EventTurnCompleted {
		t.Fatalf("turn ended with %s", got[len(got)-1].Type)
	}
	// The worker's log holds exactly what the browser got.
	all := p.OpenStream(conv, 0)
	all.Until(10*time.Second, platformtest.TurnEnd)
	if len(all.Events) != len(got) {
		t.Errorf("log holds %d events, browser got %d", len(all.Events), len(got))
	}
}
