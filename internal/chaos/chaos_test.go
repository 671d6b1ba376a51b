package chaos

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/testlane"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker/claudecli"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

var (
	kills = flag.Int("chaos.kills", 20, "SIGKILLs of the worker process to inflict")
	convs = flag.Int("chaos.conversations", 4, "conversations run at once")
)

// platform is the control plane and development upstream in-process, and
// the worker as a supervised OS process.
type platform struct {
	t          *testing.T
	url        string
	userToken  string
	sessionDir string
	tmpDir     string
	upstream   *devupstream.Server

	workerAddr string
	worker     *supervised

	// cps, when set, are control-plane replicas as processes behind a
	// round-robin proxy (replicas_test.go); url is then the proxy's.
	cps *cpReplicas
}

func start(t *testing.T) *platform { return startWith(t, 0) }

// startWith starts the platform with its control plane in this process
// (replicas 0) or as that many processes sharing a PostgreSQL schema
// behind a round-robin proxy.
func startWith(t *testing.T, replicas int) *platform {
	t.Helper()
	testlane.NeedsCLI(t)
	claude, err := claudecli.Find()
	if err != nil {
		t.Fatal(err)
	}
	dir := platformtest.AgentReachableTempDir(t)
	bin := filepath.Join(dir, "talkide-worker")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/talkide/talkide/cmd/talkide-worker").CombinedOutput(); err != nil {
		t.Fatalf("build worker: %v\n%s", err, out)
	}
	p := &platform{t: t, userToken: "tk_chaos_" + token.NewID(), sessionDir: filepath.Join(dir, "sessions"),
		tmpDir: filepath.Join(dir, "cli-tmp")}
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("TALKIDE_TEST_LOGS") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "controlplane")
	}

	p.upstream = devupstream.New(devupstream.Config{MaxRecorded: 1 << 20})
	up := httptest.NewServer(p.upstream)
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)

	master, _ := token.NewMasterKey("c1")
	wAddr := freeAddr(t)
	var identity string
	if replicas > 0 {
		p.cps = startReplicas(t, dir, replicas, master, up.URL, "http://"+wAddr, p.userToken)
		p.url = p.cps.proxy.URL
		identity = p.cps.identity
	} else {
		cpLn, _ := net.Listen("tcp", "127.0.0.1:0")
		p.url = "http://" + cpLn.Addr().String()
		dbPath := filepath.Join(dir, "cp.db")
		cfg := controlplane.Config{DBPath: dbPath, MasterKeys: []token.MasterKey{master}, Upstream: upURL,
			WorkerURLTemplate: "http://" + wAddr, DevUserToken: p.userToken, Logger: log}
		// One user runs all conversations at machine speed: the fair-use
		// limit (requests per minute) would throttle the test, not test
		// the worker.
		cfg.FairUse.Window = -1
		cfg.DefaultUserLimit = 1_000_000 * 1_000_000_000 // a million dollars: a long run must not exhaust it
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		db, err := controlstore.OpenSQLite(context.Background(), dbPath)
		if err != nil {
			t.Fatal(err)
		}
		identity, err = mint.New(db, master, log).IssueIdentity(context.Background(), "demo", "dev", 0)
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cpDone := make(chan struct{})
		go func() { defer close(cpDone); controlplane.Run(ctx, cfg, cpLn) }()
		t.Cleanup(func() { cancel(); <-cpDone })
	}

	workerEnv := []string{
		"PATH=" + os.Getenv("PATH"),
		"TALKIDE_TENANT=demo", "TALKIDE_ENV=dev", "TALKIDE_WORKER_ADDR=" + wAddr,
		"TALKIDE_WORKER_REQUEST_KEYS=" + token.FormatKey(master.Derive(token.PurposeWorkerRequest, "demo", "dev")),
		"TALKIDE_GATEWAY_BASE_URL=" + p.url, "TALKIDE_WORKER_IDENTITY_TOKEN=" + identity,
		"TALKIDE_SESSION_DIR=" + p.sessionDir, "TALKIDE_CLAUDE_BIN=" + claude, "TALKIDE_WORKER_ID=chaos-worker",
		"TALKIDE_CLI_TMP_DIR=" + p.tmpDir, "TALKIDE_SHUTDOWN_GRACE=2s",
	}
	p.workerAddr = wAddr
	logFile, err := os.Create(filepath.Join(dir, "worker.log"))
	if err != nil {
		t.Fatal(err)
	}
	p.worker = supervise(&supervised{t: t, what: "worker", bin: bin, env: workerEnv, log: logFile})
	// The worker is a process of its own: a test that ends without
	// stopping it would leave it running after the test binary is gone.
	t.Cleanup(p.stop)
	p.waitReady()
	return p
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// kill SIGKILLs the worker process (not its children: the CLI dies with it
// through its parent-death signal, tools are left for recovery to find) and
// waits until it is gone.
func (p *platform) kill() { <-p.worker.signal(syscall.SIGKILL) }

func (p *platform) stop() { p.worker.stop() }

func (p *platform) waitReady() {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(p.url + "/healthz"); err == nil {
			resp.Body.Close()
		}
		if p.worker.running() {
			if resp, err := http.Get("http://" + p.workerAddr + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	logs, _ := os.ReadFile(p.worker.log.Name())
	p.t.Fatalf("worker not ready; log:\n%s", logs)
}

func (p *platform) call(method, path string, in any, out any) (int, error) {
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = strings.NewReader(string(b))
	}
	req, _ := http.NewRequest(method, p.url+path, body)
	req.Header.Set("Authorization", "Bearer "+p.userToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		_ = json.Unmarshal(b, out)
	}
	return resp.StatusCode, nil
}

// watch follows a conversation's browser stream, reconnecting with
// Last-Event-ID whenever it breaks (platformtest.Watcher).
func (p *platform) watch(ctx context.Context, conv string) *platformtest.Watcher {
	return (&platformtest.Platform{T: p.t, URL: p.url, UserToken: p.userToken}).Watch(ctx, conv)
}

// send posts a message, retrying the same client message id while the
// worker is down (the retry is idempotent).
func (p *platform) send(conv, id, text string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := p.call("POST", "/api/conversations/"+conv+"/messages", map[string]string{"text": text, "client_message_id": id}, nil)
		if err == nil && st == http.StatusAccepted {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("send %s: status %d, %v", id, st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestChaos(t *testing.T) { runChaos(t, start(t)) }

// runChaos runs conversations on p while SIGKILLing its worker (and, with
// replicas, its control-plane replicas, in turn) at random moments, then
// checks that every browser stream got every stored event once, no turn
// is stuck, no process is left, and every conversation goes on with its
// history.
func runChaos(t *testing.T, p *platform) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ids []string
	watchers := map[string]*platformtest.Watcher{}
	for range *convs {
		var c struct{ ID string }
		if st, err := p.call("POST", "/api/conversations", map[string]string{"tenant": "demo", "env": "dev"}, &c); err != nil || st != 201 {
			t.Fatalf("create conversation: %d %v", st, err)
		}
		ids = append(ids, c.ID)
		watchers[c.ID] = p.watch(ctx, c.ID)
	}

	var turns, completed atomic.Int64
	// firstDone is, per conversation, the command of its first completed
	// turn: the final turn must still carry it in its history.
	var firstMu sync.Mutex
	firstDone := map[string]string{}
	var killed atomic.Int64
	startAt := time.Now()
	stopKilling := make(chan struct{})
	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		// Kill at random moments (early in a turn: starting the CLI, in the
		// model call; late: in a tool, writing events), but only after the
		// platform made progress since the last kill (a turn completed), so
		// that a slow machine still gets turns done between kills; before
		// the first kill every conversation completes a turn.
		lastCompleted := int64(0)
		for killed.Load() < int64(*kills) {
			deadline := time.Now().Add(3 * time.Minute)
			for {
				firstMu.Lock()
				everyone := len(firstDone) == len(ids)
				firstMu.Unlock()
				if completed.Load() > lastCompleted && (killed.Load() > 0 || everyone) {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("no turn completed for 3 minutes after kill %d", killed.Load())
					return
				}
				select {
				case <-stopKilling:
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
			select {
			case <-stopKilling:
				return
			case <-time.After(time.Duration(rand.IntN(2500)) * time.Millisecond):
			}
			lastCompleted = completed.Load()
			if p.cps != nil && killed.Load()%2 == 1 {
				p.cps.disrupt(int(killed.Load() / 2))
			} else {
				p.kill()
			}
			killed.Add(1)
			if os.Getenv("TALKIDE_TEST_LOGS") != "" {
				t.Logf("kill %d at %s (completed %d)", killed.Load(), time.Since(startAt).Round(time.Millisecond), lastCompleted)
			}
		}
	}()

	// Each conversation runs turns until the kills are done; a turn cut by
	// a kill is sent again under a new client message id.
	var wg sync.WaitGroup
	for ci, conv := range ids {
		wg.Go(func() {
			w := watchers[conv]
			for k := 0; ; k++ {
				select {
				case <-killerDone:
					return
				default:
				}
				time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond) // a person types between turns
				msgID := fmt.Sprintf("m%d", k)
				text := fmt.Sprintf("please run `echo chaos-%d-%d`", ci, k)
				if k%3 == 2 {
					text = fmt.Sprintf("please run `echo chaos-%d-%d; sleep 0.3; echo chaos-%d-%d-done`", ci, k, ci, k)
				}
				if err := p.send(conv, msgID, text); err != nil {
					t.Errorf("%s: %v", conv, err)
					return
				}
				turns.Add(1)
				ev, ok := w.TurnEnd(msgID, 180*time.Second)
				if !ok {
					t.Errorf("%s: turn %s never ended (stuck)", conv, msgID)
					return
				}
				if ev.Type == contract.EventTurnCompleted {
					completed.Add(1)
					firstMu.Lock()
					if firstDone[conv] == "" {
						firstDone[conv] = fmt.Sprintf("chaos-%d-%d", ci, k)
					}
					firstMu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(stopKilling)
	<-killerDone

	// Every conversation goes on with its history.
	resumed := 0
	for _, conv := range ids {
		before := len(p.upstream.Requests())
		if err := p.send(conv, "final", "please run `echo final-check`"); err != nil {
			t.Fatal(err)
		}
		ev, ok := watchers[conv].TurnEnd("final", 120*time.Second)
		if !ok || ev.Type != contract.EventTurnCompleted {
			t.Errorf("%s: final turn: %s %s", conv, ev.Type, ev.Data)
			continue
		}
		firstMu.Lock()
		marker := firstDone[conv]
		firstMu.Unlock()
		if marker == "" {
			t.Errorf("%s: no turn completed during the chaos; nothing to check the history with", conv)
			continue
		}
		found := false
		for _, r := range p.upstream.Requests()[before:] {
			if strings.Contains(string(r.Body), "final-check") && strings.Contains(string(r.Body), marker) {
				found = true
			}
		}
		if found {
			resumed++
		}
	}
	_ = resumed

	// Give the streams a moment to deliver the last events, then compare
	// each with the worker's durable log: nothing lost, nothing twice.
	store, err := sessionstore.Open(filepath.Join(p.sessionDir, "talkide"))
	if err != nil {
		t.Fatal(err)
	}
	var lost, dups, stuck int
	for _, conv := range ids {
		w := watchers[conv]
		logRd, err := store.OpenEventLogReader(conv)
		if err != nil {
			t.Fatal(err)
		}
		stored, _ := logRd.Since(0, 1<<30)
		deadline := time.Now().Add(10 * time.Second)
		for len(w.Events()) < len(stored) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		got := w.Events()
		seen := map[int64]int{}
		for i, ev := range got {
			seen[ev.ID]++
			if seen[ev.ID] > 1 {
				dups++
			}
			if i > 0 && ev.ID != got[i-1].ID+1 && seen[ev.ID] == 1 {
				t.Errorf("%s: stream jumped from %d to %d", conv, got[i-1].ID, ev.ID)
			}
		}
		for _, ev := range stored {
			if seen[ev.ID] == 0 {
				lost++
			}
		}
		// No turn stuck: every turn_started has its end.
		open := map[string]bool{}
		for _, ev := range stored {
			var m struct {
				ClientMessageID string `json:"client_message_id"`
			}
			json.Unmarshal(ev.Data, &m)
			switch ev.Type {
			case contract.EventTurnStarted:
				open[m.ClientMessageID] = true
			case contract.EventTurnCompleted, contract.EventTurnFailed:
				delete(open, m.ClientMessageID)
			}
		}
		stuck += len(open)
		var st struct {
			Worker contract.SessionStatus `json:"worker"`
		}
		p.call("GET", "/api/conversations/"+conv, nil, &st)
		if st.Worker.State == contract.StateRunning || st.Worker.QueuedMessages > 0 {
			stuck++
		}
	}

	// Stop the worker cleanly: nothing it or its agents started may remain.
	cancel()
	p.stop()
	orphans := 0
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		orphans = countOrphans(p.tmpDir)
		if orphans == 0 || time.Now().After(deadline) {
			break
		}
	}
	summary := fmt.Sprintf("chaos kills=%d turns=%d lost_events=%d duplicate_events=%d stuck=%d orphans=%d resumed=%d",
		killed.Load(), turns.Load(), lost, dups, stuck, orphans, resumed)
	if p.cps != nil {
		summary += " " + p.cps.summary()
	}
	fmt.Println(summary)
	t.Log(summary)
	if killed.Load() < int64(*kills) || lost != 0 || dups != 0 || stuck != 0 || orphans != 0 || resumed != len(ids) {
		logs, _ := os.ReadFile(p.worker.log.Name())
		if len(logs) > 20000 {
			logs = logs[len(logs)-20000:]
		}
		t.Errorf("chaos failed: %s\nworker log tail:\n%s", summary, logs)
	}
	if completed.Load() == 0 {
		t.Error("no turn completed at all")
	}
}

// countOrphans counts processes whose environment names a CLI temp dir
// under root: CLIs and the tools they started.
func countOrphans(root string) int {
	marker := []byte("CLAUDE_CODE_TMPDIR=" + root + "/")
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if len(env) > 0 && strings.Contains(string(env), string(marker)) {
			stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && !strings.HasPrefix(strings.TrimSpace(string(stat[i+1:])), "Z") {
				n++
			}
		}
	}
	return n
}
