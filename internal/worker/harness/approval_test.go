package harness

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
)

// TestReadOnlyCommandsAreAskedAbout: with the "ask" policy, a command the
// CLI would run without asking (read-only ones: git status, ls, cat) is
// asked about too, since it runs what the agent planted: a repository
// setting that runs a program, a shell start-up file, the shell snapshot
// the CLI sources before every command. Denied, nothing of it runs; nor
// does a global git setting in the agent's HOME at the CLI's own git calls.
func TestReadOnlyCommandsAreAskedAbout(t *testing.T) {
	r := startRig(t, rigOptions{policy: PolicyAsk, permTimeout: 30 * time.Second})
	mustCreate(t, r.h, "ro")
	ws := filepath.Join(r.h.cfg.WorkspaceRoot, "ro")
	e := r.follow(t, "ro")
	// Planted the way a build or an approved command would: a repository
	// whose settings run a program on `git status`, a shell start-up file.
	mark := filepath.Join(ws, "planted-ran")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(ws, ".git"), 0o700))
	for _, c := range [][]string{{"git", "init", "-q"}} {
		cmd := exec.Command(c[0], c[1:]...)
		cmd.Dir = ws
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", c, err, out)
		}
	}
	must(os.WriteFile(filepath.Join(ws, "f"), []byte("x"), 0o600))
	for _, c := range [][]string{{"git", "add", "f"}, {"git", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "f"}} {
		cmd := exec.Command(c[0], c[1:]...)
		cmd.Dir = ws
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", c, err, out)
		}
	}
	must(os.WriteFile(filepath.Join(ws, "f"), []byte("y"), 0o600)) // same size, same second: git must hash it (with the filter)
	if out, err := exec.Command("git", "-C", ws, "config", "core.fsmonitor", "touch "+mark+"; false").CombinedOutput(); err != nil {
		t.Fatalf("git config: %v %s", err, out)
	}
	// A global git setting in the agent's HOME (a clean filter of every
	// file): the CLI's own git status at its start must not run it.
	home := filepath.Join(r.h.cfg.HomeDir, "ro")
	must(os.MkdirAll(home, 0o700))
	must(os.WriteFile(filepath.Join(home, ".gitconfig"), []byte("[filter \"x\"]\n\tclean = touch "+mark+"-global; cat\n"), 0o600))
	must(os.WriteFile(filepath.Join(ws, ".gitattributes"), []byte("* filter=x\n"), 0o600))
	for i, cmd := range []string{"git status --short", "ls", "cat f"} {
		id := "m" + string(rune('1'+i))
		n := len(e.snapshot())
		mustSend(t, r.h, "ro", id, "please run `"+cmd+"`")
		req, _ := waitEvent(t, e, contract.EventPermissionRequested, n, 60*time.Second)
		pr := payload[contract.PermissionRequested](t, req)
		var in struct{ Command string }
		_ = json.Unmarshal(pr.Input, &in)
		if pr.ToolName != "Bash" || in.Command != cmd {
			t.Fatalf("%s: permission_requested %+v", cmd, pr)
		}
		if _, err := r.h.AnswerPermission("ro", pr.RequestID, contract.PermissionAnswer{Behavior: "deny", Message: "no"}); err != nil {
			t.Fatal(err)
		}
		waitEvent(t, e, contract.EventTurnCompleted, n, 60*time.Second)
	}
	for _, m := range []string{mark, mark + "-global"} {
		if _, err := os.Stat(m); err == nil {
			t.Errorf("a program the agent planted ran on a command nobody approved (%s)", filepath.Base(m))
		}
	}
}
