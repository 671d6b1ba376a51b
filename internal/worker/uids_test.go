package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/workerclient"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/testlane"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker"
	"github.com/talkide/talkide/internal/worker/claudecli"
	"github.com/talkide/talkide/internal/worker/sandbox"
)

// startTenantWorker runs a worker of tenant/dev on its own session volume
// with the development upstream, after edit adjusted its config.
func startTenantWorker(t *testing.T, tenant string, edit func(*worker.Config)) *replica {
	t.Helper()
	testlane.NeedsCLI(t)
	bin, err := claudecli.Find()
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(devupstream.New(devupstream.Config{}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("TALKIDE_TEST_LOGS") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("tenant", tenant)
	}
	master, _ := token.NewMasterKey("k1")
	key := master.Derive(token.PurposeWorkerRequest, tenant, "dev")
	cfg := worker.Config{Tenant: tenant, Env: "dev", RequestKeys: []token.Key{key}, NoOpUpstream: upURL,
		SessionDir: filepath.Join(platformtest.AgentReachableTempDir(t), "sessions"), ClaudeBin: bin,
		WorkerID: tenant + "-worker", ShutdownGrace: 5 * time.Second, Logger: log}
	if err := os.MkdirAll(cfg.SessionDir, 0o711); err != nil {
		t.Fatal(err)
	}
	edit(&cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := worker.Run(ctx, cfg, ln); err != nil {
			t.Errorf("worker %s: %v", tenant, err)
		}
	}()
	u, _ := url.Parse("http://" + ln.Addr().String())
	r := &replica{url: u.String(), client: workerclient.New(u, tenant, "dev", key)}
	var once sync.Once
	r.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(r.stop)
	for deadline := time.Now().Add(30 * time.Second); r.client.Ready(context.Background()) != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("worker %s not ready", tenant)
		}
	}
	return r
}

// runCommand has conv's agent run command (development upstream demo) and
// returns the tool result.
func runCommand(t *testing.T, r *replica, conv, command string) string {
	t.Helper()
	st, err := r.client.Status(context.Background(), conv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.SendMessage(context.Background(), conv, contract.SendMessageRequest{
		ClientMessageID: token.NewID(), UserID: "u1", Text: "please run `" + command + "`"}); err != nil {
		t.Fatal(err)
	}
	var result string
	for _, ev := range followTurn(t, r, conv, st.LastEventID) {
		if ev.Type == contract.EventToolResult {
			result = platformtest.Payload[contract.ToolResult](t, ev).Content
		}
		if ev.Type == contract.EventTurnFailed {
			t.Fatalf("turn failed: %s", ev.Data)
		}
	}
	return result
}

// followTurn reads conv's events after after until the turn ends.
func followTurn(t *testing.T, r *replica, conv string, after int64) []contract.Event {
	t.Helper()
	return follow(t, r, conv, after, turnEnd)
}

func wantStatus(t *testing.T, err error, status int, what string) {
	t.Helper()
	var we *workerclient.Error
	if !errors.As(err, &we) || we.Status != status {
		t.Fatalf("%s: got %v, want HTTP %d", what, err, status)
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: agents run as uids of their own")
	}
}

// TestDeleteReleasesTheAgentUID guards against case C6's uid exhaustion:
// agent uids were claimed per conversation and never released, so enough
// conversations used up the range for the whole tenant-env. With a range
// of one uid, a second conversation is refused (429) until the first is
// deleted; the delete ends the agent's detached processes, removes its
// workspace and its files in /tmp, and then the uid serves the next
// conversation.
func TestDeleteReleasesTheAgentUID(t *testing.T) {
	needRoot(t)
	const uid = 3_950_000
	t.Cleanup(func() { _ = sandbox.KillUID(uid) })
	host := t.TempDir()
	w := startTenantWorker(t, "acme", func(c *worker.Config) {
		c.AgentUser = "per-conversation"
		c.AgentUIDRange = sandbox.UIDRange{First: uid, Count: 1}
		c.HostUIDDir = host
	})
	ctx := context.Background()
	st, err := w.client.CreateSession(ctx, "c1", contract.CreateSessionRequest{UserID: "u1"})
	if err != nil {
		t.Fatal(err)
	}
	leftover := fmt.Sprintf("/tmp/talkide-c6-%s", token.NewID())
	out := runCommand(t, w, "c1", "setsid sleep 3021 >/dev/null 2>&1 & setsid env -i /bin/sleep 3022 >/dev/null 2>&1 & echo x > "+leftover+"; id -u")
	if !strings.Contains(out, strconv.Itoa(uid)) {
		t.Fatalf("the agent runs as %q, want uid %d", out, uid)
	}
	if len(sandbox.ProcessesOf(uid)) == 0 {
		t.Fatal("the agent's detached sleeps are not running")
	}

	_, err = w.client.CreateSession(ctx, "c2", contract.CreateSessionRequest{UserID: "u1"})
	wantStatus(t, err, http.StatusTooManyRequests, "a conversation with every uid taken")

	del, err := w.client.DeleteSession(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if !del.AgentUIDReleased || del.ConversationID != "c1" {
		t.Errorf("delete answered %+v", del)
	}
	if pids := sandbox.ProcessesOf(uid); len(pids) != 0 {
		t.Errorf("processes of the deleted conversation's uid still run: %v", pids)
	}
	for _, p := range []string{st.WorkDir, leftover, filepath.Join(filepath.Dir(filepath.Dir(st.WorkDir)), "talkide", "conversations", "c1")} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survives the delete (err %v)", p, err)
		}
	}
	_, err = w.client.Status(ctx, "c1")
	wantStatus(t, err, http.StatusNotFound, "status of a deleted conversation")
	_, err = w.client.DeleteSession(ctx, "c1")
	wantStatus(t, err, http.StatusNotFound, "deleting again")

	if _, err := w.client.CreateSession(ctx, "c2", contract.CreateSessionRequest{UserID: "u1"}); err != nil {
		t.Fatalf("a conversation after the delete released the uid: %v", err)
	}
	if out := runCommand(t, w, "c2", "id -u; ls "+leftover+" 2>&1 | head -1"); !strings.Contains(out, strconv.Itoa(uid)) || !strings.Contains(out, "No such file") {
		t.Errorf("the next conversation: %q, want uid %d and none of c1's files", out, uid)
	}
}

// TestTwoWorkersOnOneHostNeverShareAUID guards against case C6's
// collision: two workers of different tenant-envs on one host, each with
// its own session volume, claimed uids from the same range independently,
// so the same conversation id got the same uid on both. Sharing the host
// claim directory they never do; with the range full, the next
// conversation is refused instead of shared.
func TestTwoWorkersOnOneHostNeverShareAUID(t *testing.T) {
	needRoot(t)
	const first = 3_960_000
	t.Cleanup(func() { _ = sandbox.KillUID(first); _ = sandbox.KillUID(first + 1) })
	host := t.TempDir()
	cfg := func(c *worker.Config) {
		c.AgentUser = "per-conversation"
		c.AgentUIDRange = sandbox.UIDRange{First: first, Count: 2}
		c.HostUIDDir = host
	}
	a := startTenantWorker(t, "acme", cfg)
	b := startTenantWorker(t, "beta", cfg)
	ctx := context.Background()
	uids := map[string]string{}
	for name, w := range map[string]*replica{"acme": a, "beta": b} {
		// The same conversation id on both: the same starting point of the
		// uid search.
		if _, err := w.client.CreateSession(ctx, "c1", contract.CreateSessionRequest{UserID: "u1"}); err != nil {
			t.Fatal(err)
		}
		uids[name] = strings.TrimSpace(runCommand(t, w, "c1", "id -u"))
	}
	if uids["acme"] == uids["beta"] {
		t.Fatalf("both workers' agents run as uid %s", uids["acme"])
	}
	_, err := a.client.CreateSession(ctx, "c2", contract.CreateSessionRequest{UserID: "u1"})
	wantStatus(t, err, http.StatusTooManyRequests, "a third conversation on a host with two uids")
	if _, err := b.client.DeleteSession(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.client.CreateSession(ctx, "c2", contract.CreateSessionRequest{UserID: "u1"}); err != nil {
		t.Fatalf("after the other worker's delete: %v", err)
	}
	if got := strings.TrimSpace(runCommand(t, a, "c2", "id -u")); got != uids["beta"] {
		t.Errorf("the freed uid: got %s, want %s", got, uids["beta"])
	}
}

// TestConversationQuotas: a worker caps conversations per user and per
// tenant-env (the control plane's backstop); a refusal is 429 rate_limited
// naming the setting, and an existing conversation is still served.
func TestConversationQuotas(t *testing.T) {
	w := startTenantWorker(t, "acme", func(c *worker.Config) {
		c.AgentUser = "self"
		c.MaxConversationsPerUser = 2
		c.MaxConversations = 3
	})
	ctx := context.Background()
	create := func(conv, user string) error {
		_, err := w.client.CreateSession(ctx, conv, contract.CreateSessionRequest{UserID: user})
		return err
	}
	for _, c := range []string{"a1", "a2"} {
		if err := create(c, "alice"); err != nil {
			t.Fatal(err)
		}
	}
	err := create("a3", "alice")
	var we *workerclient.Error
	if !errors.As(err, &we) || we.Status != 429 || we.Type != contract.ErrTypeRateLimited || !strings.Contains(we.Msg, "TALKIDE_MAX_CONVERSATIONS_PER_USER") {
		t.Errorf("alice's third: got %v, want 429 rate_limited naming TALKIDE_MAX_CONVERSATIONS_PER_USER", err)
	}
	if err := create("a1", "alice"); err != nil {
		t.Errorf("creating an existing conversation again: %v", err)
	}
	if err := create("b1", "bob"); err != nil {
		t.Fatal(err)
	}
	err = create("c1", "carol")
	if !errors.As(err, &we) || we.Status != 429 || !strings.Contains(we.Msg, "TALKIDE_MAX_CONVERSATIONS_PER_TENANT_ENV") {
		t.Errorf("a fourth in the tenant-env: got %v, want 429 naming TALKIDE_MAX_CONVERSATIONS_PER_TENANT_ENV", err)
	}
	if _, err := w.client.DeleteSession(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	if err := create("a3", "alice"); err != nil {
		t.Errorf("after a delete: %v", err)
	}
}

// TestOrphanUIDsAreReleasedAtStart: a delete cut short by a crash (state
// gone, uid still claimed) leaves nothing claimed once a worker starts.
func TestOrphanUIDsAreReleasedAtStart(t *testing.T) {
	needRoot(t)
	const uid = 3_980_000
	session := filepath.Join(platformtest.AgentReachableTempDir(t), "sessions")
	r := sandbox.UIDRange{First: uid, Count: 2, Dir: filepath.Join(session, "talkide", "agent-uids")}
	if _, err := r.Claim("ghost"); err != nil {
		t.Fatal(err)
	}
	ghostWork := filepath.Join(session, "workspaces", "ghost")
	if err := os.MkdirAll(ghostWork, 0o700); err != nil {
		t.Fatal(err)
	}
	startTenantWorker(t, "acme", func(c *worker.Config) {
		c.SessionDir = session
		c.AgentUser = "per-conversation"
		c.AgentUIDRange = sandbox.UIDRange{First: uid, Count: 2}
	})
	claims, err := r.Claims()
	if err != nil {
		t.Fatal(err)
	}
	if len(claims) != 0 {
		t.Errorf("claims after start: %v, want none", claims)
	}
	if _, err := os.Stat(ghostWork); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted conversation's workspace survives: %v", err)
	}
}
