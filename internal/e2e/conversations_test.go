package e2e

import (
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/worker"
	"github.com/talkide/talkide/internal/worker/sandbox"
)

// processesInRange lists the pids running as a uid of [first, first+n).
func processesInRange(first, n uint32) []int {
	var pids []int
	for u := first; u < first+n; u++ {
		pids = append(pids, sandbox.ProcessesOf(u)...)
	}
	return pids
}

// TestConversationQuotaAndDelete guards against case C6 through the
// browser API: a user could create conversations without end (each
// claiming an agent uid for good, about 100k exhausting the tenant-env's
// range), and there was no way to end one. Now the control plane caps live
// conversations per user (429 rate_limited in the documented error shape),
// and DELETE /api/conversations/{id} stops the agent (its detached
// processes too), removes its files on the worker and frees its place.
func TestConversationQuotaAndDelete(t *testing.T) {
	const first, count = 3_970_000, 4
	t.Cleanup(func() {
		for u := uint32(first); u < first+count; u++ {
			_ = sandbox.KillUID(u)
		}
	})
	host := t.TempDir()
	p := platformtest.Start(t, platformtest.Options{
		ControlPlane: func(c *controlplane.Config) { c.MaxConversationsPerUser = 2 },
		Worker: func(c *worker.Config) {
			c.AgentUIDRange = sandbox.UIDRange{First: first, Count: count}
			c.HostUIDDir = host
		},
	})
	c1, c2 := p.NewConversation(), p.NewConversation()
	st, eb := p.DoAs(p.UserToken, "POST", "/api/conversations", "application/json", `{"tenant":"demo","env":"dev"}`)
	if st != http.StatusTooManyRequests || eb.Error.Type != contract.ErrTypeRateLimited || !strings.Contains(eb.Error.Message, "TALKIDE_MAX_CONVERSATIONS_PER_USER") {
		t.Fatalf("a third conversation with a cap of 2: got %d %+v, want 429 rate_limited naming TALKIDE_MAX_CONVERSATIONS_PER_USER", st, eb)
	}

	// c1's agent leaves a detached process behind.
	s := p.OpenStream(c1, 0)
	p.Send(c1, "please run `setsid sleep 3031 >/dev/null 2>&1 & setsid env -i /bin/sleep 3032 >/dev/null 2>&1 & echo started`")
	if ev := s.Until(5*time.Minute, platformtest.TurnEnd); ev.Type != contract.EventTurnCompleted {
		t.Fatalf("turn: %s %s", ev.Type, ev.Data)
	}
	if isRoot() && len(processesInRange(first, count)) == 0 {
		t.Fatal("the agent's detached processes are not running")
	}
	var status struct {
		Worker *contract.SessionStatus `json:"worker"`
	}
	p.Do("GET", "/api/conversations/"+c1, nil, &status)
	if status.Worker == nil {
		t.Fatal("no worker status of c1")
	}

	// Another user cannot delete it.
	p.AddUser("mallory", "tk_mallory", [2]string{"demo", "dev"})
	if st, _ := p.DoAs("tk_mallory", "DELETE", "/api/conversations/"+c1, "", ""); st != http.StatusNotFound {
		t.Errorf("another user's DELETE: got %d, want 404", st)
	}
	// A browser stream open during the delete ends with it.
	req, _ := http.NewRequest("GET", p.URL+"/api/conversations/"+c1+"/stream", nil)
	req.Header.Set("Authorization", "Bearer "+p.UserToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("open stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	streamEnded := make(chan struct{})
	go func() { io.Copy(io.Discard, resp.Body); close(streamEnded) }()
	if st, eb := p.DoAs(p.UserToken, "DELETE", "/api/conversations/"+c1, "", ""); st != http.StatusNoContent {
		t.Fatalf("DELETE: got %d %+v, want 204", st, eb)
	}
	select {
	case <-streamEnded:
	case <-time.After(2 * time.Minute):
		t.Error("the browser stream of the deleted conversation is still open")
	}
	if isRoot() {
		if pids := processesInRange(first, count); len(pids) != 0 {
			t.Errorf("processes of the deleted conversation's agent still run: %v", pids)
		}
	}
	if _, err := lstat(status.Worker.WorkDir); err == nil {
		t.Errorf("the deleted conversation's workspace %s survives", status.Worker.WorkDir)
	}
	for _, path := range []string{"/api/conversations/" + c1, "/api/conversations/" + c1 + "/stream"} {
		if st, _ := p.DoAs(p.UserToken, "GET", path, "", ""); st != http.StatusNotFound {
			t.Errorf("GET %s after the delete: got %d, want 404", path, st)
		}
	}
	if st, _ := p.DoAs(p.UserToken, "POST", "/api/conversations/"+c1+"/messages", "application/json", `{"text":"hi"}`); st != http.StatusNotFound {
		t.Errorf("a message to a deleted conversation: got %d, want 404", st)
	}
	if st, _ := p.DoAs(p.UserToken, "DELETE", "/api/conversations/"+c1, "", ""); st != http.StatusNotFound {
		t.Errorf("DELETE again: got %d, want 404", st)
	}
	// Its place is free again; c2 was untouched.
	p.NewConversation()
	if st := p.Do("GET", "/api/conversations/"+c2, nil, nil); st != http.StatusOK {
		t.Errorf("the other conversation: got %d", st)
	}
}

func isRoot() bool { return os.Geteuid() == 0 }

func lstat(p string) (os.FileInfo, error) { return os.Lstat(p) }
