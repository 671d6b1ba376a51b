package harness

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/testlane"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker/claudecli"
	"github.com/talkide/talkide/internal/worker/lease"
	"github.com/talkide/talkide/internal/worker/localproxy"
	"github.com/talkide/talkide/internal/worker/sandbox"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// rig is a harness driving the real CLI against the development upstream
// (straight, through NoOpGatewayProxy), on a session volume that several
// rigs may share (replicas).
type rig struct {
	h        *Harness
	upstream *devupstream.Server
	cancel   context.CancelFunc
	done     chan struct{}
}

type rigOptions struct {
	volume       string
	holder       string
	maxProcesses int
	idleTimeout  time.Duration
	upstream     *devupstream.Server
	policy       string
	permTimeout  time.Duration
	// noJail runs CLIs unjailed (TALKIDE_CONTAINMENT=weak); limits are the
	// jail's (zero: defaults); diskLimit caps each conversation's disk use.
	noJail bool
	// noCgroups jails CLIs without control groups, as in a pod whose
	// cgroup is read-only.
	noCgroups bool
	limits    sandbox.Limits
	diskLimit int64
	// fileLimit caps its files (inodes); diskEvery is how often its
	// directories are walked (default 500 ms).
	fileLimit int64
	diskEvery time.Duration
	// wrapLeases, when set, wraps the rig's lease backend (to count its
	// calls).
	wrapLeases func(lease.Manager) lease.Manager
	// shutdownGrace is ShutdownGrace (2 s when zero).
	shutdownGrace time.Duration
	// claudeBin replaces the pinned CLI (buildStandin's stand-in).
	claudeBin string
}

// testJail is a jail as the worker builds one, with its own control group.
// The tests run as root here and in CI, where bwrap and cgroups must work:
// a missing piece fails the test.
func testJail(t *testing.T, l sandbox.Limits) *sandbox.Jail {
	t.Helper()
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		t.Fatalf("bwrap: %v (make tools installs bubblewrap)", err)
	}
	prlimit, _ := exec.LookPath("prlimit")
	cg, err := sandbox.OpenCgroups("rig-" + token.NewID()[:10])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cg.Close)
	// The test binary is the jail's helper (TestMain), as the worker's is:
	// agents get a network of their own.
	helper, err := sandbox.InstallHelper(filepath.Join(os.TempDir(), "talkide-test-jail-helper-"+strconv.Itoa(os.Getpid())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(helper)) })
	return &sandbox.Jail{Bwrap: bwrap, Prlimit: prlimit, Cgroups: cg, Limits: l.WithDefaults(), Helper: helper}
}

func startRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	testlane.NeedsCLI(t)
	bin, err := claudecli.Find()
	if err != nil {
		t.Fatal(err)
	}
	if o.claudeBin != "" {
		bin = o.claudeBin
	}
	if o.volume == "" {
		o.volume = t.TempDir()
	}
	if o.holder == "" {
		o.holder = "replica-a"
	}
	if o.upstream == nil {
		o.upstream = devupstream.New(devupstream.Config{})
	}
	up := httptest.NewServer(o.upstream)
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("TALKIDE_TEST_LOGS") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("replica", o.holder)
	}
	diskEvery := o.diskEvery
	if diskEvery == 0 {
		diskEvery = 500 * time.Millisecond
	}
	var jail *sandbox.Jail
	if !o.noJail {
		jail = testJail(t, o.limits)
		if o.noCgroups {
			jail.Cgroups.Close()
			jail.Cgroups = nil
		}
	}
	local := localproxy.NewServer(&localproxy.NoOpGatewayProxy{Upstream: upURL}, log)
	ln, err := local.Listen()
	if err != nil {
		t.Fatal(err)
	}
	store, err := sessionstore.Open(filepath.Join(o.volume, "talkide"))
	if err != nil {
		t.Fatal(err)
	}
	id := lease.Identity{Holder: o.holder, Incarnation: token.NewID(), Address: "http://" + o.holder}
	fileLeases, err := lease.NewFileManager(filepath.Join(o.volume, "talkide", "leases"), lease.Config{Identity: id, Duration: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var leases lease.Manager = fileLeases
	if o.wrapLeases != nil {
		leases = o.wrapLeases(leases)
	}
	grace := o.shutdownGrace
	if grace == 0 {
		grace = 2 * time.Second
	}
	h, err := New(Config{
		ClaudeBin: bin, ConfigDir: filepath.Join(o.volume, "cfg"), WorkspaceRoot: filepath.Join(o.volume, "ws"),
		HomeDir: filepath.Join(o.volume, "home"), TmpRoot: filepath.Join(t.TempDir(), "tmp"),
		MaxProcesses: o.maxProcesses, IdleTimeout: o.idleTimeout, Leases: leases, Identity: id,
		ShutdownGrace: grace, RecoverInterval: 200 * time.Millisecond, Logger: log,
		PermissionPolicy: o.policy, PermissionTimeout: o.permTimeout, Jail: jail, DiskLimit: o.diskLimit, DiskFileLimit: o.fileLimit, DiskCheckEvery: diskEvery,
	}, store, local)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &rig{h: h, upstream: o.upstream, cancel: cancel, done: make(chan struct{})}
	go local.Serve(ctx, ln)
	go func() { defer close(r.done); h.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

func (r *rig) stop() {
	r.cancel()
	<-r.done
}

// crash stops the rig as SIGKILL would stop a worker: nothing more is
// taken up (its recovery loop would otherwise load the conversations
// again) or written: every session is dropped with its process killed,
// then the harness stops with nothing left to shut down.
func (r *rig) crash() {
	r.h.closing.Store(true)
	for _, s := range r.h.loaded() {
		s.lose()
	}
	r.stop()
}

// events collects a conversation's events from its log as they come.
type events struct {
	mu  sync.Mutex
	evs []contract.Event
}

func (e *events) add(ev contract.Event) error {
	e.mu.Lock()
	e.evs = append(e.evs, ev)
	e.mu.Unlock()
	return nil
}

func (e *events) snapshot() []contract.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]contract.Event(nil), e.evs...)
}

func (e *events) count(t contract.EventType) int {
	n := 0
	for _, ev := range e.snapshot() {
		if ev.Type == t {
			n++
		}
	}
	return n
}

func (r *rig) follow(t *testing.T, conv string) *events {
	t.Helper()
	e := &events{}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan error, 1)
	go func() {
		err := r.h.Follow(ctx, conv, 0, 0, e.add, nil, func() error { started <- nil; return nil })
		select {
		case started <- err:
		default:
		}
	}()
	if err := <-started; err != nil {
		t.Fatalf("follow %s: %v", conv, err)
	}
	t.Cleanup(cancel)
	return e
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mustCreate(t *testing.T, h *Harness, conv string) {
	t.Helper()
	if _, err := h.CreateSession(conv, contract.CreateSessionRequest{UserID: "u1"}); err != nil {
		t.Fatalf("create %s: %v", conv, err)
	}
}

func mustSend(t *testing.T, h *Harness, conv, id, text string) {
	t.Helper()
	if _, err := h.SendMessage(conv, contract.SendMessageRequest{ClientMessageID: id, UserID: "u1", Text: text}); err != nil {
		t.Fatalf("send %s to %s: %v", id, conv, err)
	}
}

// TestCapacityQueuesTurnsAndResumesStoppedSessions runs five conversations
// on a worker capped at two CLI processes: turns beyond the cap wait
// (turn_queued), idle processes are stopped to make room, and a stopped
// session later resumes with its history.
func TestCapacityQueuesTurnsAndResumesStoppedSessions(t *testing.T) {
	r := startRig(t, rigOptions{maxProcesses: 2})
	reg := prometheus.NewRegistry()
	r.h.RegisterMetrics(reg)
	convs := []string{"c1", "c2", "c3", "c4", "c5"}
	logs := map[string]*events{}
	var maxLive int
	var mu sync.Mutex
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(5 * time.Millisecond):
			}
			n := countCLIProcesses(r)
			mu.Lock()
			maxLive = max(maxLive, n)
			mu.Unlock()
		}
	}()
	for _, c := range convs {
		mustCreate(t, r.h, c)
		logs[c] = r.follow(t, c)
	}
	for _, c := range convs {
		mustSend(t, r.h, c, "m1", "please run `echo first-"+c+"`")
	}
	for _, c := range convs {
		waitFor(t, c+" first turn", 90*time.Second, func() bool { return logs[c].count(contract.EventTurnCompleted) == 1 })
	}
	queued := 0
	for _, c := range convs {
		queued += logs[c].count(contract.EventTurnQueued)
	}
	if queued < 3 {
		t.Errorf("turn_queued events: %d, want at least 3 (five turns, two processes)", queued)
	}
	// Everyone's second turn: the sessions stopped to make room resume
	// from their transcripts, with their history.
	before := len(r.upstream.Requests())
	for _, c := range convs {
		mustSend(t, r.h, c, "m2", "what did I ask before?")
	}
	for _, c := range convs {
		waitFor(t, c+" second turn", 90*time.Second, func() bool { return logs[c].count(contract.EventTurnCompleted) == 2 })
	}
	close(stopWatch)
	<-watchDone
	if maxLive > 2 {
		t.Errorf("at most %d CLI processes ran at once, cap is 2", maxLive)
	}
	resumed := 0
	for _, c := range convs {
		for _, ev := range logs[c].snapshot() {
			if ev.Type == contract.EventSessionStarted && strings.Contains(string(ev.Data), `"resumed":true`) {
				resumed++
			}
		}
	}
	if resumed == 0 {
		t.Error("no session was stopped and resumed")
	}
	if got := metricValue(t, reg, "talkide_worker_turns_queued_total", nil); got < 3 {
		t.Errorf("talkide_worker_turns_queued_total = %v, want at least 3", got)
	}
	if got := metricValue(t, reg, "talkide_worker_turns_total", map[string]string{"outcome": "completed"}); got != 10 {
		t.Errorf("talkide_worker_turns_total{outcome=completed} = %v, want 10", got)
	}
	if got := metricValue(t, reg, "talkide_worker_cli_processes_max", nil); got != 2 {
		t.Errorf("talkide_worker_cli_processes_max = %v, want 2", got)
	}
	for _, req := range r.upstream.Requests()[before:] {
		if req.Path != "/v1/messages" || !strings.Contains(string(req.Body), "what did I ask before?") {
			continue
		}
		if !strings.Contains(string(req.Body), "echo first-") {
			t.Errorf("a second turn was sent without its history")
		}
	}
}

// countCLIProcesses counts live CLI processes of this test process: its
// children running the CLI in stream-json mode. (Tools the CLI starts run in
// process groups of their own and, until they exec, look like the CLI: only
// direct children count.)
func countCLIProcesses(r *rig) int {
	me := strconv.Itoa(os.Getpid())
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 || f[1] != me || f[0] == "Z" {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(cmd), "stream-json") && strings.Contains(string(cmd), r.h.cfg.ClaudeBin) {
			n++
		}
	}
	return n
}

// TestTwoReplicasNeverDriveOneConversation runs two harnesses (replicas)
// on one volume: the one that has a conversation loaded (here: a stream
// follows it) owns it, the other is refused with the owner's address; once
// the owner lets go (idle), the other takes over and resumes with the
// history.
func TestTwoReplicasNeverDriveOneConversation(t *testing.T) {
	vol := t.TempDir()
	up := devupstream.New(devupstream.Config{})
	a := startRig(t, rigOptions{volume: vol, holder: "replica-a", upstream: up, idleTimeout: 300 * time.Millisecond})
	b := startRig(t, rigOptions{volume: vol, holder: "replica-b", upstream: up, idleTimeout: 300 * time.Millisecond})
	mustCreate(t, a.h, "shared")
	ea := a.follow(t, "shared")
	var noe *NotOwnerError
	if _, err := b.h.Status("shared"); !errors.As(err, &noe) || noe.Owner.Holder != "replica-a" || noe.Owner.Address != "http://replica-a" {
		t.Fatalf("replica b on a's conversation: got %v, want NotOwnerError naming replica-a", err)
	}
	if _, err := b.h.SendMessage("shared", contract.SendMessageRequest{ClientMessageID: "m0", UserID: "u1", Text: "x"}); !errors.As(err, &noe) {
		t.Fatalf("replica b sending: got %v, want NotOwnerError", err)
	}
	mustSend(t, a.h, "shared", "m1", "please run `echo owned-by-a`")
	waitFor(t, "a's turn", 60*time.Second, func() bool { return ea.count(contract.EventTurnCompleted) == 1 })
	// Let a drop the conversation: no follower, idle process stopped.
	for _, s := range a.h.loaded() {
		s.mu.Lock()
		s.followers = 0
		s.mu.Unlock()
	}
	waitFor(t, "a to let go", 30*time.Second, func() bool { _, err := b.h.Status("shared"); return err == nil })
	eb := b.follow(t, "shared")
	mustSend(t, b.h, "shared", "m2", "please run `echo owned-by-b`")
	waitFor(t, "b's turn", 60*time.Second, func() bool { return eb.count(contract.EventTurnCompleted) >= 2 })
	if _, err := a.h.Status("shared"); !errors.As(err, &noe) || noe.Owner.Holder != "replica-b" {
		t.Errorf("replica a after the hand-over: got %v, want NotOwnerError naming replica-b", err)
	}
	// One event log, ids contiguous across the hand-over.
	evs := eb.snapshot()
	for i, ev := range evs {
		if ev.ID != int64(i+1) {
			t.Fatalf("event %d has id %d after the hand-over: %v", i, ev.ID, evs)
		}
	}
	var history bool
	for _, req := range up.Requests() {
		if strings.Contains(string(req.Body), "owned-by-b") && strings.Contains(string(req.Body), "owned-by-a") {
			history = true
		}
	}
	if !history {
		t.Error("replica b did not resume with replica a's history")
	}
}

// metricValue returns the value of the metric name with labels from reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	return -1
}

// TestConcurrentLoadsOfOneConversation has many streams open at once on a
// conversation no one has loaded: it is loaded once (one lease acquisition,
// one session) and every stream is served.
func TestConcurrentLoadsOfOneConversation(t *testing.T) {
	vol := t.TempDir()
	a := startRig(t, rigOptions{volume: vol, holder: "replica-a"})
	mustCreate(t, a.h, "c")
	a.stop() // releases the lease
	before, err := a.h.cfg.Leases.Get(context.Background(), "c")
	if err != nil {
		t.Fatal(err)
	}
	b := startRig(t, rigOptions{volume: vol, holder: "replica-b"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			errs <- b.h.Follow(ctx, "c", 0, 0, func(contract.Event) error { return nil }, nil, func() error { errs <- nil; return nil })
		})
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Errorf("stream during concurrent loads: %v", err)
		}
	}
	if n := len(b.h.loaded()); n != 1 {
		t.Errorf("loaded sessions: %d, want 1", n)
	}
	after, err := b.h.cfg.Leases.Get(context.Background(), "c")
	if err != nil {
		t.Fatal(err)
	}
	if after.Generation != before.Generation+1 || after.Holder != "replica-b" {
		t.Errorf("lease went from %+v to %+v, want one acquisition by replica-b", before, after)
	}
	cancel()
	wg.Wait()
}
