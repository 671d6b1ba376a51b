package sessionstore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWorkDirIn guards against case W3: state.json held the absolute
// working directory of the mount it was saved on, and a worker with the
// volume mounted elsewhere ran (and re-created) that old path. Now the
// working directory is a name under the current workspace root; state of
// older workers is migrated when it names the conversation's own directory
// under any root, and refused when it names anything else.
func TestWorkDirIn(t *testing.T) {
	const root, conv = "/new/mount/workspaces", "c1"
	want := filepath.Join(root, conv)
	for _, tc := range []struct {
		name              string
		workspace, stored string
		changed           bool
		refused           bool
	}{
		{name: "current state", workspace: conv, stored: want},
		{name: "current state saved at another mount", workspace: conv, stored: "/old/mount/workspaces/c1", changed: true},
		{name: "current state without the old path", workspace: conv, changed: true},
		{name: "older worker's state, other mount", stored: "/old/mount/workspaces/c1", changed: true},
		{name: "older worker's state, same mount", stored: want, changed: true},
		{name: "older worker's state naming nothing", changed: true},

		{name: "a path outside any workspace", stored: "/etc", refused: true},
		{name: "another conversation's directory", stored: "/new/mount/workspaces/c2", refused: true},
		{name: "beneath the conversation's directory", stored: "/new/mount/workspaces/c1/sub", refused: true},
		{name: "an unclean path", stored: "/new/mount/workspaces/c2/../c1", refused: true},
		{name: "a relative path", stored: "workspaces/c1", refused: true},
		{name: "a bare name", stored: "c1", refused: true},
		{name: "another conversation's workspace", workspace: "c2", stored: "/new/mount/workspaces/c2", refused: true},
		{name: "a workspace climbing out", workspace: "../../etc", refused: true},
		{name: "a workspace with a separator", workspace: "c1/..", refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &Meta{ConversationID: conv, Workspace: tc.workspace, WorkDir: tc.stored}
			dir, changed, err := m.WorkDirIn(root, conv)
			if tc.refused {
				if !errors.Is(err, ErrWorkDir) {
					t.Fatalf("got %q, %v; want ErrWorkDir", dir, err)
				}
				if m.Workspace != tc.workspace || m.WorkDir != tc.stored {
					t.Errorf("refused state was changed to workspace %q, work dir %q", m.Workspace, m.WorkDir)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if dir != want || changed != tc.changed {
				t.Errorf("got %q changed=%v, want %q changed=%v", dir, changed, want, tc.changed)
			}
			if m.Workspace != conv || m.WorkDir != want {
				t.Errorf("state to save: workspace %q, work dir %q; want %q, %q", m.Workspace, m.WorkDir, conv, want)
			}
		})
	}
	for _, bad := range []string{"", "relative/root", "/root/../x"} {
		if _, _, err := (&Meta{ConversationID: conv}).WorkDirIn(bad, conv); err == nil {
			t.Errorf("workspace root %q accepted", bad)
		}
	}
	if _, _, err := (&Meta{}).WorkDirIn(root, ".."); err == nil {
		t.Error("conversation id \"..\" accepted")
	}
}

// TestLoadMetaRefusesAnotherConversationsState: a state file naming
// another conversation would be saved back into that one's directory.
func TestLoadMetaRefusesAnotherConversationsState(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SaveMeta(&Meta{ConversationID: "c1", UserID: "u"}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(s.Dir("c2"), 0o700); err != nil {
		t.Fatal(err)
	}
	files, err := os.ReadDir(s.Dir("c1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(s.Dir("c1"), f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(s.Dir("c2"), f.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.LoadMeta("c2"); err == nil || !strings.Contains(err.Error(), `names conversation "c1"`) {
		t.Errorf("state of c1 loaded as c2's: err %v", err)
	}
	if _, err := s.LoadMeta("c1"); err != nil {
		t.Errorf("c1: %v", err)
	}
}
