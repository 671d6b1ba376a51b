// Package platformtest starts the whole platform inside a test: the
// development upstream, the control plane (SQLite in a temp dir) and one
// worker driving the real pinned Claude Code CLI, all over real HTTP on
// loopback. It also gives a small browser-API client.
//
// It is for tests only; cmd/talkide runs the same parts as processes.
package platformtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/controlplane/workerclient"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/sse"
	"github.com/talkide/talkide/internal/testlane"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker"
	"github.com/talkide/talkide/internal/worker/claudecli"
)

// UpstreamAPIKey is the API key the test upstream demands; only the
// control plane is given it.
const UpstreamAPIKey = "sk-ant-test-upstream-key"

// Options adjust Start.
type Options struct {
	// WorkerEnv are extra TALKIDE_CLI_EXTRA_ENV entries for the CLI.
	CLIExtraEnv []string
	// IdleTimeout of CLI processes (default: the harness default).
	IdleTimeout time.Duration
	// Wrap, when set, wraps the control plane's handler (to observe calls).
	Wrap func(http.Handler) http.Handler
	// ControlPlane and Worker, when set, adjust the parts' configurations
	// before they are validated.
	ControlPlane func(*controlplane.Config)
	Worker       func(*worker.Config)
}

// Platform is a running platform.
type Platform struct {
	T         testing.TB
	Master    token.MasterKey
	UserToken string
	Tenant    string
	Env       string
	// URL is the control plane's base URL.
	URL string
	// WorkerURL is the worker's base URL.
	WorkerURL string
	Upstream  *devupstream.Server
	// SessionDir is the worker's session volume.
	SessionDir string
	// DBPath is the control plane's SQLite database.
	DBPath string

	cpCfg  controlplane.Config
	wrap   func(http.Handler) http.Handler
	wCfg   worker.Config
	cpAddr string
	wAddr  string

	mu sync.Mutex
	// stopWorker and stopControlPlane stop the running parts and wait for
	// them (as SIGTERM would); guarded by mu.
	stopWorker, stopControlPlane func()
}

// ClaudeBin returns the pinned CLI or fails the test with how to install it.
func ClaudeBin(t testing.TB) string {
	t.Helper()
	testlane.NeedsCLI(t)
	bin, err := claudecli.Find()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return bin
}

// Start starts the platform for tenant demo, env dev, and stops it at the
// end of the test. The worker and the control plane can be restarted
// (RestartWorker, RestartControlPlane) on the same addresses and state.
func Start(t testing.TB, opts Options) *Platform {
	t.Helper()
	bin := ClaudeBin(t)
	dir := AgentReachableTempDir(t)
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	master, err := token.NewMasterKey("t1")
	if err != nil {
		t.Fatal(err)
	}
	p := &Platform{T: t, Master: master, UserToken: "tk_test_" + token.NewID(), Tenant: "demo", Env: "dev",
		SessionDir: filepath.Join(dir, "sessions"), DBPath: filepath.Join(dir, "cp.db"), wrap: opts.Wrap}

	p.Upstream = devupstream.New(devupstream.Config{APIKey: UpstreamAPIKey, Logger: log.With("component", "devupstream")})
	up := httptest.NewServer(p.Upstream)
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)

	cpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.cpAddr, p.wAddr = cpLn.Addr().String(), wLn.Addr().String()
	p.URL = "http://" + p.cpAddr
	p.WorkerURL = "http://" + p.wAddr
	t.Cleanup(func() {
		p.mu.Lock()
		stops := []func(){p.stopWorker, p.stopControlPlane}
		p.mu.Unlock()
		for _, stop := range stops {
			if stop != nil {
				stop()
			}
		}
	})

	p.cpCfg = controlplane.Config{
		DBPath: p.DBPath, MasterKeys: []token.MasterKey{master}, Upstream: upURL, APIKey: UpstreamAPIKey,
		WorkerURLTemplate: p.WorkerURL, DevUserToken: p.UserToken, Logger: log.With("component", "controlplane"),
	}
	if opts.ControlPlane != nil {
		opts.ControlPlane(&p.cpCfg)
	}
	if err := p.cpCfg.Validate(); err != nil {
		t.Fatal(err)
	}
	db, err := controlstore.OpenSQLite(context.Background(), p.DBPath)
	if err != nil {
		t.Fatal(err)
	}
	identity, err := mint.New(db, master, log).IssueIdentity(context.Background(), p.Tenant, p.Env, 0)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	p.startControlPlane(cpLn)
	cpURL, _ := url.Parse(p.URL)
	p.wCfg = worker.Config{
		Tenant: p.Tenant, Env: p.Env,
		RequestKeys:    []token.Key{master.Derive(token.PurposeWorkerRequest, p.Tenant, p.Env)},
		GatewayBaseURL: cpURL, IdentityToken: identity,
		SessionDir: p.SessionDir, ClaudeBin: bin, IdleTimeout: opts.IdleTimeout,
		CLIExtraEnv: opts.CLIExtraEnv, Logger: log.With("component", "worker"),
	}
	if opts.Worker != nil {
		opts.Worker(&p.wCfg)
	}
	if err := p.wCfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p.startWorker(wLn)
	p.waitHealthy()
	return p
}

// StartRestartable is Start; kept for tests that say they restart parts.
func StartRestartable(t testing.TB, opts Options) *Platform { return Start(t, opts) }

func (p *Platform) startControlPlane(ln net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		cfg := p.cpCfg
		cfg.Middleware = p.wrap
		if err := controlplane.Run(ctx, cfg, ln); err != nil {
			p.T.Errorf("control plane: %v", err)
		}
	}()
	p.mu.Lock()
	p.stopControlPlane = func() { cancel(); <-done }
	p.mu.Unlock()
}

func (p *Platform) startWorker(ln net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := worker.Run(ctx, p.wCfg, ln); err != nil {
			p.T.Errorf("worker: %v", err)
		}
	}()
	p.mu.Lock()
	p.stopWorker = func() { cancel(); <-done }
	p.mu.Unlock()
}

// restart stops a part with stop and starts it again on addr.
func (p *Platform) restart(stop *func(), addr string, start func(net.Listener)) {
	p.T.Helper()
	p.mu.Lock()
	s := *stop
	*stop = nil
	p.mu.Unlock()
	if s != nil {
		s()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		p.T.Fatalf("listen again on %s: %v", addr, err)
	}
	start(ln)
}

// RestartWorker stops the worker (as SIGTERM would) and starts a new one on
// the same session volume and address, then waits until it is ready.
func (p *Platform) RestartWorker() {
	p.T.Helper()
	p.restart(&p.stopWorker, p.wAddr, p.startWorker)
	p.waitHealthy()
}

// StopWorker stops the worker (as SIGTERM would) and leaves it stopped:
// the control plane then finds it unreachable.
func (p *Platform) StopWorker() {
	p.mu.Lock()
	s := p.stopWorker
	p.stopWorker = nil
	p.mu.Unlock()
	if s != nil {
		s()
	}
}

// RestartControlPlane stops the control plane (cutting every browser
// stream) and starts it again on the same address and database.
func (p *Platform) RestartControlPlane() {
	p.T.Helper()
	p.restart(&p.stopControlPlane, p.cpAddr, p.startControlPlane)
}

func (p *Platform) waitHealthy() {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(p.WorkerURL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.T.Fatal("platform did not become ready")
}

// Do sends a browser API request with the user's token and decodes a JSON
// answer into out (when non-nil). It returns the status.
func (p *Platform) Do(method, path string, in, out any) int {
	p.T.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, p.URL+path, body)
	req.Header.Set("Authorization", "Bearer "+p.UserToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.T.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			p.T.Fatalf("%s %s: decode %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode
}

// NewConversation creates a conversation and returns its id.
func (p *Platform) NewConversation() string {
	p.T.Helper()
	return p.NewConversationFrom("")
}

// NewConversationFrom creates a conversation whose working tree starts
// from the sample project sample ("" for an empty one) and returns its id.
func (p *Platform) NewConversationFrom(sample string) string {
	p.T.Helper()
	var out struct {
		ID string `json:"id"`
	}
	if st := p.Do("POST", "/api/conversations", map[string]string{"tenant": p.Tenant, "env": p.Env, "sample": sample}, &out); st != http.StatusCreated {
		p.T.Fatalf("create conversation from sample %q: status %d", sample, st)
	}
	return out.ID
}

// Send sends a message and returns the client message id.
func (p *Platform) Send(conv, text string) string {
	p.T.Helper()
	var out contract.SendMessageResponse
	if st := p.Do("POST", "/api/conversations/"+conv+"/messages", map[string]string{"text": text}, &out); st != http.StatusAccepted {
		p.T.Fatalf("send message: status %d", st)
	}
	return out.ClientMessageID
}

// Stream is a browser SSE stream of a conversation.
type Stream struct {
	t    testing.TB
	resp *http.Response
	r    *sse.Reader
	// Events are all events read so far.
	Events []contract.Event
}

// OpenStream opens the browser stream after event id after.
func (p *Platform) OpenStream(conv string, after int64) *Stream {
	p.T.Helper()
	req, _ := http.NewRequest("GET", p.URL+"/api/conversations/"+conv+"/stream", nil)
	req.Header.Set("Authorization", "Bearer "+p.UserToken)
	req.Header.Set("Last-Event-ID", fmt.Sprint(after))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.T.Fatal(err)
	}
	if resp.StatusCode != 200 {
		resp.Body.Close()
		p.T.Fatalf("open stream: status %d", resp.StatusCode)
	}
	s := &Stream{t: p.T, resp: resp, r: sse.NewReader(bufio.NewReader(resp.Body))}
	p.T.Cleanup(func() { resp.Body.Close() })
	return s
}

// Until reads events until one satisfies stop (returned) or the timeout
// passes (the test fails). It checks that SSE ids and payload ids agree.
func (s *Stream) Until(timeout time.Duration, stop func(contract.Event) bool) contract.Event {
	s.t.Helper()
	type res struct {
		ev  contract.Event
		err error
	}
	deadline := time.After(timeout)
	for {
		ch := make(chan res, 1)
		go func() {
			e, err := s.r.Next()
			if err != nil {
				ch <- res{err: err}
				return
			}
			var ev contract.Event
			if err := json.Unmarshal(e.Data, &ev); err != nil {
				ch <- res{err: err}
				return
			}
			if fmt.Sprint(ev.ID) != e.ID || string(ev.Type) != e.Type {
				ch <- res{err: fmt.Errorf("SSE id/event %q/%q differ from payload %d/%s", e.ID, e.Type, ev.ID, ev.Type)}
				return
			}
			ch <- res{ev: ev}
		}()
		select {
		case r := <-ch:
			if r.err != nil {
				s.t.Fatalf("read stream: %v (events so far: %s)", r.err, Summary(s.Events))
			}
			s.Events = append(s.Events, r.ev)
			if stop(r.ev) {
				return r.ev
			}
		case <-deadline:
			s.resp.Body.Close()
			s.t.Fatalf("no matching event within %s; events: %s", timeout, Summary(s.Events))
		}
	}
}

// TurnEnd matches turn_completed or turn_failed.
func TurnEnd(ev contract.Event) bool {
	return ev.Type == contract.EventTurnCompleted || ev.Type == contract.EventTurnFailed
}

// Summary lists events as "id:type" for failure messages.
func Summary(evs []contract.Event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%d:%s ", e.ID, e.Type)
		if e.Type == contract.EventTurnFailed || e.Type == contract.EventError {
			fmt.Fprintf(&b, "%s ", e.Data)
		}
	}
	return b.String()
}

// Payload decodes an event's data into T.
func Payload[T any](t testing.TB, ev contract.Event) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(ev.Data, &v); err != nil {
		t.Fatalf("decode %s payload: %v", ev.Type, err)
	}
	return v
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	if os.Getenv("TALKIDE_TEST_LOGS") != "" {
		w.t.Log(strings.TrimRight(string(b), "\n"))
	}
	return len(b), nil
}

// WorkerClient returns a signed client of the worker, as the control plane has.
func (p *Platform) WorkerClient() *workerclient.Client {
	u, _ := url.Parse(p.WorkerURL)
	return workerclient.New(u, p.Tenant, p.Env, p.Master.Derive(token.PurposeWorkerRequest, p.Tenant, p.Env))
}

// AddUser creates a browser user with bearer token tok and grants
// ("tenant/env" pairs).
func (p *Platform) AddUser(id, tok string, grants ...[2]string) {
	p.T.Helper()
	db, err := controlstore.OpenSQLite(context.Background(), p.DBPath)
	if err != nil {
		p.T.Fatal(err)
	}
	defer db.Close()
	if err := db.UpsertUser(context.Background(), controlstore.User{ID: id, TokenHash: controlstore.HashUserToken(tok)}, grants...); err != nil {
		p.T.Fatal(err)
	}
}

// DoAs is Do with another user's token and raw body and content type.
func (p *Platform) DoAs(tok, method, path, contentType, body string) (int, contract.ErrorBody) {
	p.T.Helper()
	req, _ := http.NewRequest(method, p.URL+path, strings.NewReader(body))
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.T.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var eb contract.ErrorBody
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &eb)
	return resp.StatusCode, eb
}

// CreateConversationInDB stores a conversation for the dev user without
// telling the worker (as if the worker had been down at creation).
func (p *Platform) CreateConversationInDB(id, model string) {
	p.T.Helper()
	db, err := controlstore.OpenSQLite(context.Background(), p.DBPath)
	if err != nil {
		p.T.Fatal(err)
	}
	defer db.Close()
	if err := db.CreateConversation(context.Background(), controlstore.Conversation{ID: id, Tenant: p.Tenant, Env: p.Env, UserID: "dev", Model: model, CreatedAt: time.Now()}); err != nil {
		p.T.Fatal(err)
	}
}

// AgentReachableTempDir returns a test temp dir that an agent running as
// another (unprivileged) user can traverse, as a worker running as root
// requires: the test's temp dirs are 0700 otherwise.
func AgentReachableTempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// WaitControlPlane waits until the control plane answers /healthz.
func (p *Platform) WaitControlPlane() {
	p.T.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(p.URL + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.T.Fatal("control plane did not come back")
}

// LogBuffer is a bytes.Buffer safe for concurrent writers (a logger) and
// readers (the test looking for what was logged, or leaked).
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// HostProcesses returns the host's processes whose command line starts
// with prefix, as "pid: command line": what a test looks for to see that
// an agent's processes ended.
func HostProcesses(prefix string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.HasPrefix(strings.ReplaceAll(string(b), "\x00", " "), prefix) {
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// Watcher follows a conversation's browser stream, reconnecting with
// Last-Event-ID whenever it breaks (a worker or control-plane restart),
// and records every event it got, in order.
type Watcher struct {
	mu   sync.Mutex
	cond *sync.Cond
	evs  []contract.Event // guarded by mu
}

// Watch follows conv's stream until ctx ends.
func (p *Platform) Watch(ctx context.Context, conv string) *Watcher {
	w := &Watcher{}
	w.cond = sync.NewCond(&w.mu)
	go func() {
		for ctx.Err() == nil {
			last := int64(0)
			if evs := w.Events(); len(evs) > 0 {
				last = evs[len(evs)-1].ID
			}
			req, _ := http.NewRequestWithContext(ctx, "GET", p.URL+"/api/conversations/"+conv+"/stream", nil)
			req.Header.Set("Authorization", "Bearer "+p.UserToken)
			req.Header.Set("Last-Event-ID", fmt.Sprint(last))
			resp, err := http.DefaultClient.Do(req)
			if err != nil || resp.StatusCode != http.StatusOK {
				if err == nil {
					resp.Body.Close()
				}
				time.Sleep(200 * time.Millisecond)
				continue
			}
			r := sse.NewReader(bufio.NewReader(resp.Body))
			for {
				e, err := r.Next()
				if err != nil {
					break
				}
				var ev contract.Event
				if json.Unmarshal(e.Data, &ev) != nil {
					continue
				}
				w.mu.Lock()
				w.evs = append(w.evs, ev)
				w.cond.Broadcast()
				w.mu.Unlock()
			}
			resp.Body.Close()
		}
	}()
	return w
}

// Events returns a copy of the events received so far.
func (w *Watcher) Events() []contract.Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]contract.Event(nil), w.evs...)
}

// Gaps describes where the received event ids are not 1, 2, 3, ... with
// no gap and no repeat; "" when they are.
func (w *Watcher) Gaps() string {
	var b strings.Builder
	for i, ev := range w.Events() {
		if ev.ID != int64(i)+1 {
			fmt.Fprintf(&b, "event %d has id %d; ", i+1, ev.ID)
		}
	}
	return b.String()
}

// TurnEnd waits until the stream holds the end (turn_completed or
// turn_failed) of the turn of client message id, and returns it; false
// after timeout.
func (w *Watcher) TurnEnd(id string, timeout time.Duration) (contract.Event, bool) {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() { w.mu.Lock(); w.cond.Broadcast(); w.mu.Unlock() })
	defer timer.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		for _, ev := range w.evs {
			if !TurnEnd(ev) {
				continue
			}
			var m struct {
				ClientMessageID string `json:"client_message_id"`
			}
			json.Unmarshal(ev.Data, &m)
			if m.ClientMessageID == id {
				return ev, true
			}
		}
		if time.Now().After(deadline) {
			return contract.Event{}, false
		}
		w.cond.Wait()
	}
}

// SendRetrying sends a message, retrying the same client message id (an
// idempotent retry) for up to two minutes while the worker is away, and
// returns that id.
func (p *Platform) SendRetrying(conv, text string) string {
	p.T.Helper()
	id := "m-" + token.NewID()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var out contract.SendMessageResponse
		st := p.Do("POST", "/api/conversations/"+conv+"/messages", map[string]string{"text": text, "client_message_id": id}, &out)
		if st == http.StatusAccepted {
			return id
		}
		if time.Now().After(deadline) {
			p.T.Fatalf("send %q: status %d for two minutes", text, st)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
