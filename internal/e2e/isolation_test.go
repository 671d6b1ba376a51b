package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/platformtest"
)

// TestConversationsCannotReadEachOther has one conversation's agent try to
// read another conversation's files, transcript and CLI environment (whose
// placeholder credential would let it spend as the other conversation).
// The worker runs as root in the tests, so each conversation's agent runs as
// a user of its own.
func TestConversationsCannotReadEachOther(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	b := p.NewConversation()
	sb := p.OpenStream(b, 0)
	p.Send(b, "please run `echo secret-of-b > secret.txt && cat secret.txt`")
	if end := sb.Until(60*time.Second, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
		t.Fatalf("b's turn: %s %s", end.Type, end.Data)
	}
	var st struct {
		Worker contract.SessionStatus `json:"worker"`
	}
	p.Do("GET", "/api/conversations/"+b, nil, &st)
	// b's CLI process is still alive (idle), with its credential in its
	// environment.
	a := p.NewConversation()
	sa := p.OpenStream(a, 0)
	probe := "cat " + filepath.Join(st.Worker.WorkDir, "secret.txt") + "; " +
		"cat " + filepath.Join(p.SessionDir, "claude-config", b) + "/projects/*/*.jsonl | head -c 200; " +
		"for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f 2>/dev/null | grep ANTHROPIC_BASE_URL; done; echo probe-done"
	p.Send(a, "please run `"+probe+"`")
	sa.Until(60*time.Second, platformtest.TurnEnd)
	var out string
	for _, ev := range sa.Events {
		if ev.Type == contract.EventToolResult {
			out = platformtest.Payload[contract.ToolResult](t, ev).Content
		}
	}
	if !strings.Contains(out, "probe-done") {
		t.Fatalf("the probe did not run: %q", out)
	}
	if strings.Contains(out, "secret-of-b") {
		t.Error("conversation a read conversation b's file")
	}
	if strings.Contains(out, `"sessionId"`) || strings.Contains(out, "queue-operation") {
		t.Error("conversation a read conversation b's transcript")
	}
	var own bool
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "ANTHROPIC_BASE_URL=") {
			continue
		}
		if strings.HasSuffix(line, "/"+b) {
			t.Errorf("conversation a read the environment of conversation b's CLI (its placeholder credential too): %s", line)
		}
		own = own || strings.HasSuffix(line, "/"+a)
	}
	if !own {
		t.Errorf("the probe should see its own CLI's environment; got %q", out)
	}
}
