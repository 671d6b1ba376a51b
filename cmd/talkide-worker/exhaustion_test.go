package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// The tests of this file run the worker as a real process: the test binary
// itself, re-executed with envExecMain set, runs main().
const envExecMain = "TALKIDE_TEST_EXEC_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envExecMain) == "1" {
		main()
		os.Exit(0)
	}
	kubetest.Main(m) // kube_test.go runs the worker as its ServiceAccount

}

// guard bounds waits for something that must happen; it only turns a hang
// into a failure and says nothing about speed.
const guard = 2 * time.Minute

// nofile is the worker's RLIMIT_NOFILE in the test (soft and hard: Go
// raises the soft limit to the hard one at start).
const nofile = 512

// workerProcess is a worker running as a child process.
type workerProcess struct{ *platformtest.Process }

// startWorkerProcess starts the worker under `prlimit --nofile` with env and
// waits until it listens.
func startWorkerProcess(t *testing.T, env []string) *workerProcess {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	lim := strconv.Itoa(nofile)
	cmd := exec.Command("prlimit", "--nofile="+lim+":"+lim, "--", self)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TALKIDE_") && !strings.HasPrefix(kv, "ANTHROPIC_") && !strings.HasPrefix(kv, "CLAUDE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, envExecMain+"=1"), env...)
	return &workerProcess{platformtest.StartProcess(t, cmd, "worker listening", os.Interrupt, guard)}
}

// answer is one browser API answer.
type answer struct {
	status     int
	retryAfter string
	body       []byte
}

func call(method, u, tok string, body string) (answer, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: b}, nil
}

// checkRefusal checks that a refused answer is a 503 (with Retry-After) or
// a 429 in the documented error shape.
func checkRefusal(t *testing.T, what string, a answer) {
	t.Helper()
	var eb contract.ErrorBody
	if err := json.Unmarshal(a.body, &eb); err != nil || eb.Error.Type == "" || eb.Error.Message == "" {
		t.Errorf("%s: %d %q is not in the error shape {\"error\":{\"type\",\"message\"}}", what, a.status, a.body)
		return
	}
	switch {
	case a.status == http.StatusServiceUnavailable && eb.Error.Type == contract.ErrTypeUnavailable && a.retryAfter != "":
	case a.status == http.StatusTooManyRequests && eb.Error.Type == contract.ErrTypeRateLimited:
	default:
		t.Errorf("%s: got %d %s (Retry-After %q) %q, want 503 unavailable with Retry-After or 429 rate_limited", what, a.status, eb.Error.Type, a.retryAfter, eb.Error.Message)
	}
}

// TestOpenFilesLimitRefusesAndLosesNothing guards case W2 (issue 11 item
// 3): at its open-files limit the worker refused connections, answered
// state saves with 500, dropped sessions (killing their agents) and a
// report, and the control plane answered creates 201 with no session
// behind them.
//
// The worker runs as its own process with RLIMIT_NOFILE lowered to 512,
// behind a real control plane, with the real CLI. One conversation's agent
// is busy with a command; meanwhile conversations are created and their
// browser streams opened until the worker refuses both (or has taken twice
// as many conversations as it may open files, once idle conversations are
// unloaded). Every refusal must
// be a 503 with Retry-After (or a 429) in the documented error shape; every
// create answered 201 must have its session on the worker (in the answer,
// readable afterwards, with a state file that parses); the busy agent's
// turn must complete (nothing dropped, no agent killed); every event must
// be reported to the control plane in the end; and the worker must never
// have met "too many open files".
func TestOpenFilesLimitRefusesAndLosesNothing(t *testing.T) {
	r := newRig(t)
	tenant, env, sessions, cpURL, userToken := r.tenant, r.env, r.sessions, r.cpURL, r.userToken
	w := startWorkerProcess(t, r.workerEnv("TALKIDE_WORKER_IDENTITY_TOKEN="+r.identity,
		"TALKIDE_MAX_CONVERSATIONS_PER_TENANT_ENV=100000", "TALKIDE_MAX_CONVERSATIONS_PER_USER=100000"))
	p := r.startControlPlane(w.URL, func(c *controlplane.Config) {
		c.MaxConversationsPerUser, c.MaxConversationsPerTenantEnv = 100000, 100000
	})

	// A conversation whose agent is busy while the limit is met.
	busy := p.NewConversation()
	busyStream := p.OpenStream(busy, 0)
	p.Send(busy, "please run `sleep 3; echo busy-agent-done`")
	busyStream.Until(guard, func(ev contract.Event) bool { return ev.Type == contract.EventToolUse })

	// Create conversations and open their streams until the worker refuses
	// both (or takes twice as many conversations as it may open files),
	// four at a time.
	create := `{"tenant":"` + tenant + `","env":"` + env + `"}`
	var (
		mu                             sync.Mutex
		created                        []string
		createRefusals, streamRefusals []answer
		streams                        []*http.Response
		failures                       []string
	)
	streamsOpen := true
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(failures) > 0 || len(streamRefusals) >= 1 && (len(createRefusals) >= 8 || len(created) >= 2*nofile)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for !done() {
				a, err := call("POST", cpURL+"/api/conversations", userToken, create)
				if err != nil {
					mu.Lock()
					failures = append(failures, "create: "+err.Error())
					mu.Unlock()
					return
				}
				if a.status != http.StatusCreated {
					mu.Lock()
					createRefusals = append(createRefusals, a)
					mu.Unlock()
					continue
				}
				var c struct {
					ID     string                  `json:"id"`
					Worker *contract.SessionStatus `json:"worker"`
				}
				if err := json.Unmarshal(a.body, &c); err != nil || c.ID == "" {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("create answered 201 %q", a.body))
					mu.Unlock()
					return
				}
				mu.Lock()
				created = append(created, c.ID)
				if c.Worker == nil {
					failures = append(failures, "create answered 201 without the worker's session: "+c.ID)
				}
				open := streamsOpen
				mu.Unlock()
				if !open {
					continue
				}
				req, _ := http.NewRequest("GET", cpURL+"/api/conversations/"+c.ID+"/stream", nil)
				req.Header.Set("Authorization", "Bearer "+userToken)
				resp, err := http.DefaultClient.Do(req)
				mu.Lock()
				switch {
				case err != nil:
					failures = append(failures, "stream: "+err.Error())
				case resp.StatusCode == http.StatusOK:
					streams = append(streams, resp)
				default:
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					streamRefusals = append(streamRefusals, answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: b})
					streamsOpen = false // enough streams: go on with creates only
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	t.Logf("%d conversations created, %d streams open; %d creates and %d streams refused", len(created), len(streams), len(createRefusals), len(streamRefusals))
	// Creates are refused once the worker's open conversations fill its
	// budget; a worker that unloads idle conversations may instead take
	// more conversations than it can open files, which is as good.
	if len(streamRefusals) == 0 || len(createRefusals) == 0 && len(created) < 2*nofile {
		t.Fatalf("the worker never refused (creates refused %d, streams refused %d): the test did not reach its limit", len(createRefusals), len(streamRefusals))
	}
	seen := map[string]bool{}
	for i, a := range append(createRefusals, streamRefusals...) {
		checkRefusal(t, fmt.Sprintf("refusal %d", i), a)
		if msg := fmt.Sprintf("%d %s", a.status, a.body); !seen[msg] {
			seen[msg] = true
			t.Logf("refusal: %s", strings.TrimSpace(msg))
		}
	}

	// The busy agent was not killed: its turn completes.
	end := busyStream.Until(guard, platformtest.TurnEnd)
	if end.Type != contract.EventTurnCompleted {
		t.Errorf("the busy conversation's turn ended with %s %s, want turn_completed", end.Type, end.Data)
	}
	for _, s := range streams {
		s.Body.Close()
	}

	// Every create answered 201 has its session: readable through the
	// browser API (a refusal while the worker is still at its limit is
	// retried as Retry-After says), and its state file parses.
	for _, id := range created {
		deadline := time.Now().Add(guard)
		for {
			a, err := call("GET", cpURL+"/api/conversations/"+id, userToken, "")
			if err != nil {
				t.Fatalf("read %s: %v", id, err)
			}
			var c struct {
				Worker *contract.SessionStatus `json:"worker"`
			}
			if a.status == http.StatusOK && json.Unmarshal(a.body, &c) == nil && c.Worker != nil {
				break
			}
			if a.status != http.StatusServiceUnavailable || time.Now().After(deadline) {
				t.Fatalf("conversation %s (answered 201): %d %s, want 200 with the worker's session", id, a.status, a.body)
			}
			checkRefusal(t, "status read", a)
			time.Sleep(100 * time.Millisecond)
		}
	}
	store, err := sessionstore.Open(filepath.Join(sessions, "talkide"))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := store.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := store.LoadMeta(id); err != nil {
			t.Errorf("state of %s: %v", id, err)
		}
	}
	if len(ids) < len(created)+1 {
		t.Errorf("%d state files for %d conversations answered 201", len(ids), len(created)+1)
	}

	// Every event of the busy conversation is reported in the end, and the
	// outbox (issue writes) buries nothing.
	for deadline := time.Now().Add(guard); ; time.Sleep(100 * time.Millisecond) {
		a, err := call("GET", cpURL+"/api/conversations/"+busy+"/activity", userToken, "")
		if err != nil {
			t.Fatalf("read the busy conversation's activity: %v", err)
		}
		var act contract.ConversationActivity
		_ = json.Unmarshal(a.body, &act)
		if n := len(act.Activity); n > 0 && act.Activity[n-1].EventID >= end.ID {
			if int64(n) != act.Activity[n-1].EventID {
				t.Errorf("activity of the busy conversation: %d entries up to event %d", n, act.Activity[n-1].EventID)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the busy conversation's activity stops short of event %d: %d %s", end.ID, a.status, a.body)
		}
	}
	if n := entries(t, filepath.Join(sessions, "talkide", "outbox", "dead")); n > 0 {
		t.Errorf("%d reports moved to the outbox's dead letters", n)
	}

	logText := w.Log()
	for _, bad := range []string{"too many open files", "lease lost", "no space left", "dropping it"} {
		if strings.Contains(logText, bad) {
			t.Errorf("the worker logged %q", bad)
		}
	}
}

// entries counts the entry files under dir (recursively).
func entries(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".json") {
			n++
		}
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return n
}
