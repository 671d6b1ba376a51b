package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
)

// TestAgentCannotLoosenThePermissionPolicy is case C4 of
// shared/cases/containment.md: under the "ask" policy the user approves one
// command that writes permissive settings into every settings file the CLI
// reads (user settings under CLAUDE_CONFIG_DIR, project and local settings
// under the workspace's .claude/, settings under $HOME/.claude). The next
// command must still be asked about, both in the same process and after the
// process is stopped and the session resumed (when the CLI reads its
// settings afresh).
func TestAgentCannotLoosenThePermissionPolicy(t *testing.T) {
	r := startRig(t, rigOptions{policy: PolicyAsk, permTimeout: time.Minute})
	mustCreate(t, r.h, "c4")
	e := r.follow(t, "c4")
	loose := `{"permissions":{"allow":["Bash","Bash(*)","Write","Edit"],"defaultMode":"bypassPermissions"},` +
		`"hooks":{"SessionStart":[{"hooks":[{"type":"command","command":"touch $HOME/hook-ran"}]}]}}`
	write := "for f in $CLAUDE_CONFIG_DIR/settings.json $CLAUDE_CONFIG_DIR/settings.local.json " +
		".claude/settings.json .claude/settings.local.json $HOME/.claude/settings.json; do " +
		"mkdir -p $(dirname $f) && echo '" + loose + "' > $f; done; echo wrote-settings"
	mustSend(t, r.h, "c4", "m1", "please run `"+write+"`")
	req, _ := waitEvent(t, e, contract.EventPermissionRequested, 0, 3*time.Minute)
	pr := payload[contract.PermissionRequested](t, req)
	if _, err := r.h.AnswerPermission("c4", pr.RequestID, contract.PermissionAnswer{Behavior: "allow"}); err != nil {
		t.Fatal(err)
	}
	_, first := waitEvent(t, e, contract.EventTurnCompleted, 0, 3*time.Minute)
	if tr, _ := waitEvent(t, e, contract.EventToolResult, 0, time.Second); !strings.Contains(payload[contract.ToolResult](t, tr).Content, "wrote-settings") {
		t.Fatalf("the approved command did not run: %s", tr.Data)
	}

	// The same process, then a resumed one.
	for i, id := range []string{"m2", "m3"} {
		if i == 1 {
			if _, err := r.h.Stop("c4"); err != nil {
				t.Fatal(err)
			}
		}
		from := len(e.snapshot())
		mustSend(t, r.h, "c4", id, "please run `echo ran-without-asking-"+id+" > proof-"+id+".txt && cat proof-"+id+".txt`")
		waitFor(t, "a permission request or the turn's end", 3*time.Minute, func() bool {
			for _, ev := range e.snapshot()[from:] {
				if ev.Type == contract.EventPermissionRequested || ev.Type == contract.EventTurnCompleted || ev.Type == contract.EventTurnFailed {
					return true
				}
			}
			return false
		})
		var asked *contract.PermissionRequested
		for _, ev := range e.snapshot()[from:] {
			switch ev.Type {
			case contract.EventPermissionRequested:
				p := payload[contract.PermissionRequested](t, ev)
				asked = &p
			case contract.EventToolResult:
				if strings.Contains(string(ev.Data), "ran-without-asking") {
					t.Errorf("%s: the command ran without a permission request after the agent wrote settings", id)
				}
			}
		}
		if asked == nil {
			t.Fatalf("%s: no permission request (policy loosened by agent-written settings)", id)
		}
		if _, err := r.h.AnswerPermission("c4", asked.RequestID, contract.PermissionAnswer{Behavior: "deny", Message: "no"}); err != nil {
			t.Fatal(err)
		}
		waitEvent(t, e, contract.EventTurnCompleted, first+1, 3*time.Minute)
		_, first = waitEvent(t, e, contract.EventTurnCompleted, from, 3*time.Minute)
	}
	if _, err := os.Stat(filepath.Join(r.h.cfg.HomeDir, "c4", "hook-ran")); err == nil {
		t.Error("a SessionStart hook from agent-written settings ran")
	}
}
