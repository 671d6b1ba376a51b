package harness

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// saveOldState stores the state of conversation conv as a worker before
// Workspace wrote it: an absolute working directory and no workspace name.
func saveOldState(t *testing.T, volume, conv, workDir string) {
	t.Helper()
	store, err := sessionstore.Open(filepath.Join(volume, "talkide"))
	if err != nil {
		t.Fatal(err)
	}
	m := &sessionstore.Meta{ConversationID: conv, UserID: "u1", SessionID: uuid.NewString(), CreatedAt: time.Now().UTC(), WorkDir: workDir}
	if err := store.SaveMeta(m); err != nil {
		t.Fatal(err)
	}
}

// turnEnd waits for the end of the turn of client message id and returns it.
func turnEnd(t *testing.T, e *events, id string) contract.Event {
	t.Helper()
	var end contract.Event
	waitFor(t, "the end of turn "+id, 60*time.Second, func() bool {
		for _, ev := range e.snapshot() {
			if ev.Type != contract.EventTurnCompleted && ev.Type != contract.EventTurnFailed {
				continue
			}
			var p struct {
				ClientMessageID string `json:"client_message_id"`
			}
			if json.Unmarshal(ev.Data, &p) == nil && p.ClientMessageID == id {
				end = ev
				return true
			}
		}
		return false
	})
	return end
}

// TestOldAbsoluteWorkDirIsMigrated guards against case W3: state.json of an
// older worker holds the absolute working directory under the mount the
// volume had then; the worker re-created that path outside the volume and
// ran the agent there. Now it runs the agent in the conversation's
// directory under its own workspace root, stores the directory as a name
// under the root, and never creates the old path.
func TestOldAbsoluteWorkDirIsMigrated(t *testing.T) {
	volume := t.TempDir()
	oldMount := filepath.Join(t.TempDir(), "old-mount")
	saveOldState(t, volume, "c1", filepath.Join(oldMount, "ws", "c1"))
	r := startRig(t, rigOptions{volume: volume})
	e := r.follow(t, "c1")
	mustSend(t, r.h, "c1", "m1", "please run `pwd`")
	if end := turnEnd(t, e, "m1"); end.Type != contract.EventTurnCompleted {
		t.Fatalf("turn: %s %s", end.Type, end.Data)
	}
	want := filepath.Join(volume, "ws", "c1")
	var ran bool
	for _, ev := range e.snapshot() {
		ran = ran || ev.Type == contract.EventToolResult && strings.Contains(string(ev.Data), want)
	}
	if !ran {
		t.Errorf("no tool result shows the agent ran in %s: %s", want, summary(e.snapshot()))
	}
	if _, err := os.Lstat(oldMount); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the old mount path %s was created (err %v)", oldMount, err)
	}
	st, err := r.h.Status("c1")
	if err != nil || st.WorkDir != want {
		t.Errorf("status work_dir %q (err %v), want %q", st.WorkDir, err, want)
	}
	m, err := r.h.store.LoadMeta("c1")
	if err != nil {
		t.Fatal(err)
	}
	if m.Workspace != "c1" || m.WorkDir != want {
		t.Errorf("stored workspace %q, work dir %q; want c1, %s", m.Workspace, m.WorkDir, want)
	}
}

// TestWorkDirOutsideTheRootsIsRefused: a state file naming a directory
// outside the workspace root (an attacker's edit, a bad restore) never makes
// the worker create, enter, give the agent or delete that directory. The
// conversation's turns fail with start_failed saying why; it can still be
// read and deleted.
func TestWorkDirOutsideTheRootsIsRefused(t *testing.T) {
	volume := t.TempDir()
	outside := t.TempDir()
	missing := filepath.Join(outside, "missing", "victim")
	existing := filepath.Join(outside, "existing")
	if err := os.MkdirAll(existing, 0o700); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(existing, "keep")
	if err := os.WriteFile(keep, []byte("not the agent's"), 0o600); err != nil {
		t.Fatal(err)
	}
	saveOldState(t, volume, "c1", missing)
	saveOldState(t, volume, "c2", existing)
	r := startRig(t, rigOptions{volume: volume})
	for _, conv := range []string{"c1", "c2"} {
		e := r.follow(t, conv)
		mustSend(t, r.h, conv, "m1", "please run `pwd`")
		end := turnEnd(t, e, "m1")
		var f contract.TurnFailed
		_ = json.Unmarshal(end.Data, &f)
		if end.Type != contract.EventTurnFailed || f.Reason != contract.FailStartFailed || !strings.Contains(f.Message, "outside this worker's workspace root") {
			t.Errorf("%s: turn ended with %s %s, want start_failed naming the refusal", conv, end.Type, end.Data)
		}
		if st, err := r.h.Status(conv); err != nil || st.WorkDir != "" {
			t.Errorf("%s: status work_dir %q (err %v), want none", conv, st.WorkDir, err)
		}
		if _, err := r.h.Delete(conv); err != nil {
			t.Errorf("delete %s: %v", conv, err)
		}
	}
	if _, err := os.Lstat(filepath.Dir(missing)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused path %s was created (err %v)", missing, err)
	}
	if b, err := os.ReadFile(keep); err != nil || string(b) != "not the agent's" {
		t.Errorf("the refused directory's file: %q, %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(volume, "ws", "c2")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused conversation's own directory exists (err %v)", err)
	}
}

func summary(evs []contract.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		b.WriteString(string(ev.Type) + " " + string(ev.Data) + "\n")
	}
	return b.String()
}

// TestStartFailureNamesNoInternals: why the agent could not start reaches
// the browser without the worker's paths or system error text (the log has
// them); a refusal on purpose keeps its explanation.
func TestStartFailureNamesNoInternals(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("start claude: fork/exec /opt/talkide/.tools/claude: %w", syscall.ENOENT), "fault on the worker"},
		{fmt.Errorf("pipe: %w", syscall.EMFILE), "at one of its limits"},
		{&startRefused{msg: "refused to run the agent: outside the root", err: errors.New("/srv/volume/victim")}, "refused to run the agent: outside the root"},
	} {
		got := startFailedMessage(tc.err)
		if !strings.Contains(got, tc.want) || strings.Contains(got, "/") {
			t.Errorf("%v: message %q, want it to say %q and name no path", tc.err, got, tc.want)
		}
	}
}
