package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/pgtest"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
)

// TestChaosReplicas is the chaos run with two control-plane replicas
// (issue 28): processes of cmd/talkide-controlplane sharing a PostgreSQL
// schema behind a round-robin proxy without stickiness, so browser
// streams, their reconnects, the worker's model calls and reports land on
// either. Every other disruption is one of the replicas' instead of the
// worker's: a rolling restart (out of the rotation, SIGTERM, back once
// ready) or a SIGKILL. The same checks hold: every stored event reaches
// every browser stream once, no turn is stuck, nothing is left running,
// every conversation goes on with its history.
func TestChaosReplicas(t *testing.T) { runChaos(t, startWith(t, 2)) }

// cpReplicas are control-plane processes restarted when they die (as a
// Deployment's pods are) behind a plain round-robin HTTP proxy that sends
// each request to the next replica in the rotation (as a Service does with
// its ready endpoints).
type cpReplicas struct {
	t        *testing.T
	env      []string
	identity string
	proxy    *httptest.Server
	logFile  *os.File
	next     atomic.Uint64
	reps     []*cpReplica

	sigterms, sigkills atomic.Int64
}

type cpReplica struct {
	*supervised
	addr  string
	ready atomic.Bool // in the rotation
}

func startReplicas(t *testing.T, dir string, n int, master token.MasterKey, upstream, workerURL, userToken string) *cpReplicas {
	t.Helper()
	bin := filepath.Join(dir, "talkide-controlplane")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/talkide/talkide/cmd/talkide-controlplane").CombinedOutput(); err != nil {
		t.Fatalf("build control plane: %v\n%s", err, out)
	}
	dbURL := pgtest.SchemaURL(t)
	db, err := controlstore.OpenPostgres(context.Background(), dbURL, 4)
	if err != nil {
		t.Fatal(err)
	}
	identity, err := mint.New(db, master, slog.New(slog.DiscardHandler)).IssueIdentity(context.Background(), "demo", "dev", 0)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "controlplanes.log"))
	if err != nil {
		t.Fatal(err)
	}
	rs := &cpReplicas{t: t, identity: identity, logFile: logFile, env: []string{
		"PATH=" + os.Getenv("PATH"),
		"TALKIDE_DATABASE_URL=" + dbURL,
		"TALKIDE_MASTER_KEYS=" + master.String(),
		"TALKIDE_UPSTREAM_URL=" + upstream,
		"TALKIDE_WORKER_URL_TEMPLATE=" + workerURL,
		"TALKIDE_DEV_USER_TOKEN=" + userToken,
		"TALKIDE_DEV_GRANTS=demo/dev",
		// One user runs all conversations at machine speed: fair use
		// would throttle the test, and a long run must not exhaust the
		// budget.
		"TALKIDE_FAIR_USE_WINDOW=off",
		"TALKIDE_DEFAULT_USER_LIMIT_USD=1000000",
		"TALKIDE_SHUTDOWN_GRACE=5s",
	}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(&url.URL{Scheme: "http", Host: rs.pick().addr})
			r.Out.Host = r.In.Host
		},
		FlushInterval: -1,
	}
	rs.proxy = httptest.NewServer(rp)
	for range n {
		r := &cpReplica{addr: freeAddr(t)}
		r.supervised = supervise(&supervised{t: t, what: "control plane", bin: bin, log: logFile,
			env: append(append([]string(nil), rs.env...), "TALKIDE_HTTP_ADDR="+r.addr), started: r.watchReady, ended: func() { r.ready.Store(false) }})
		rs.reps = append(rs.reps, r)
	}
	t.Cleanup(func() {
		rs.proxy.Close()
		for _, r := range rs.reps {
			r.ready.Store(false)
			r.stop()
		}
		logFile.Close()
	})
	for _, r := range rs.reps {
		rs.waitReady(r)
	}
	return rs
}

// pick returns the next replica in the rotation (any, when none is in it).
func (rs *cpReplicas) pick() *cpReplica {
	for range len(rs.reps) {
		r := rs.reps[int(rs.next.Add(1))%len(rs.reps)]
		if r.ready.Load() {
			return r
		}
	}
	return rs.reps[int(rs.next.Add(1))%len(rs.reps)]
}

// watchReady puts r in the rotation once its new process answers
// /readyz (its end takes it out: ended).
func (r *cpReplica) watchReady(exited <-chan struct{}) {
	go func() {
		for {
			select {
			case <-exited:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if resp, err := http.Get("http://" + r.addr + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					r.ready.Store(true)
					return
				}
			}
		}
	}()
}

func (rs *cpReplicas) waitReady(r *cpReplica) {
	deadline := time.Now().Add(60 * time.Second)
	for !r.ready.Load() {
		if time.Now().After(deadline) {
			logs, _ := os.ReadFile(rs.logFile.Name())
			if len(logs) > 20000 {
				logs = logs[len(logs)-20000:]
			}
			rs.t.Fatalf("control plane %s not ready after 60 s; log tail:\n%s", r.addr, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// disrupt takes replica k%n down, the even times as a rolling restart does
// (out of the rotation, SIGTERM: its browser streams end with a comment,
// its model calls in flight finish), the odd times with SIGKILL (nothing
// ends cleanly), and returns once it is back in the rotation.
func (rs *cpReplicas) disrupt(k int) {
	r := rs.reps[k%len(rs.reps)]
	var exited <-chan struct{}
	if k%2 == 0 {
		r.ready.Store(false)
		exited = r.signal(syscall.SIGTERM)
		rs.sigterms.Add(1)
	} else {
		exited = r.signal(syscall.SIGKILL)
		rs.sigkills.Add(1)
	}
	<-exited
	rs.waitReady(r)
}

func (rs *cpReplicas) summary() string {
	return fmt.Sprintf("cp_replicas=%d cp_sigterms=%d cp_sigkills=%d", len(rs.reps), rs.sigterms.Load(), rs.sigkills.Load())
}

// A rolling restart of the control-plane replicas while turns run fails
// no turn and loses no event (issue 28): each replica in turn leaves the
// rotation, finishes the model calls it has in flight and ends its browser
// streams with a comment; the worker's next calls and the browsers'
// reconnects go to the other.
func TestRollingRestartOfControlPlanesFailsNoTurn(t *testing.T) {
	p := startWith(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ids []string
	for range 3 {
		var c struct{ ID string }
		if st, err := p.call("POST", "/api/conversations", map[string]string{"tenant": "demo", "env": "dev"}, &c); err != nil || st != 201 {
			t.Fatalf("create conversation: %d %v", st, err)
		}
		ids = append(ids, c.ID)
	}
	var wg sync.WaitGroup
	var failed, completed atomic.Int64
	stop := make(chan struct{})
	var watchers []*platformtest.Watcher
	for ci, conv := range ids {
		w := p.watch(ctx, conv)
		watchers = append(watchers, w)
		wg.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("m%d", k)
				if err := p.send(conv, id, fmt.Sprintf("please run `echo roll-%d-%d; sleep 0.5; echo roll-%d-%d-done`", ci, k, ci, k)); err != nil {
					t.Errorf("%s: %v", conv, err)
					return
				}
				ev, ok := w.TurnEnd(id, 120*time.Second)
				switch {
				case !ok:
					t.Errorf("%s: turn %s never ended", conv, id)
					return
				case ev.Type == contract.EventTurnCompleted:
					completed.Add(1)
				default:
					failed.Add(1)
					t.Errorf("%s: turn %s failed during the rolling restart: %s", conv, id, ev.Data)
				}
			}
		})
	}
	for k := range 4 {
		time.Sleep(700 * time.Millisecond)
		p.cps.disrupt(2 * k) // even: out of the rotation, SIGTERM, back
	}
	close(stop)
	wg.Wait()
	for i, w := range watchers {
		if gaps := w.Gaps(); gaps != "" {
			t.Errorf("%s's browser stream: %s", ids[i], gaps)
		}
	}
	t.Logf("rolling restarts=%d turns completed=%d failed=%d", p.cps.sigterms.Load(), completed.Load(), failed.Load())
	if completed.Load() == 0 {
		t.Fatal("no turn completed")
	}
}
