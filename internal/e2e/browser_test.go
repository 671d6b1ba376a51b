package e2e

import (
	"bytes"
	"cmp"
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
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/controlplane/webui"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
)

// TestBrowserUI runs the browser tests (web/e2e/*.test.mjs, `node --test`)
// against the whole platform: the control plane serving the embedded UI,
// a worker process driving the real pinned CLI, and the development
// upstream. Debian's Chromium is driven by playwright-core (web/e2e/harness.mjs).
//
// The scenarios steer the platform through a control server on loopback
// (TALKIDE_CONTROL_URL; see browserControl). Screenshots, node's output and
// the platform's logs land in test-artifacts/browser/ at the repository
// root, emptied at the start of each run, for a person to look at.
//
// Without Chromium, Node or the built UI the test fails saying what to run:
// make test runs as root and installs them (make tools, make web), so a
// skip would hide a broken set-up.
func TestBrowserUI(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	chromium := cmp.Or(os.Getenv("TALKIDE_CHROMIUM"), "/usr/bin/chromium")
	if _, err := exec.LookPath(chromium); err != nil {
		t.Fatalf("Chromium not found at %s (TALKIDE_CHROMIUM): the browser tests drive it; `make tools` installs Debian's chromium (as root; otherwise apt-get install chromium): %v", chromium, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found: the browser tests run with node --test (Debian: apt-get install nodejs npm): %v", err)
	}
	if !webui.Built() {
		t.Fatal("this test binary embeds no browser UI (internal/controlplane/webui/dist/index.html): run `make web` before go test (make test does)")
	}
	if _, err := os.Stat(filepath.Join(root, "web", "node_modules", "playwright-core", "package.json")); err != nil {
		t.Fatalf("web/node_modules has no playwright-core: run `make web` (npm ci in web/): %v", err)
	}
	artifacts := filepath.Join(root, "test-artifacts", "browser")
	if err := os.RemoveAll(artifacts); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(artifacts, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}

	started := time.Now()
	p := startBrowserPlatform(t, filepath.Join(artifacts, "logs"))
	ctl := httptest.NewServer(p.controlHandler())
	t.Cleanup(ctl.Close)
	t.Logf("platform up in %s: %s (control %s; logs in %s)", time.Since(started).Round(time.Millisecond), p.url, ctl.URL, filepath.Join(artifacts, "logs"))

	ctx := t.Context()
	if dl, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-30*time.Second))
		defer cancel()
	}
	nodeTmp := t.TempDir() // Chromium's fresh profiles (harness.mjs) go here
	cmd := exec.CommandContext(ctx, node, "--test", "--test-concurrency=1", "--test-reporter=spec", "web/e2e/")
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"TALKIDE_URL="+p.url,
		"TALKIDE_TOKEN="+p.userToken,
		"TALKIDE_CONTROL_URL="+ctl.URL,
		"TALKIDE_CHROMIUM="+chromium,
		"TALKIDE_SCREENSHOTS="+artifacts,
		"TMPDIR="+nodeTmp,
		"NO_COLOR=1",
	)
	// Killed with its children (Chromium) if the test runs out of time.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	nodeLog, err := os.Create(filepath.Join(artifacts, "logs", "node.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer nodeLog.Close()
	out := &lineLogger{t: t, file: nodeLog}
	cmd.Stdout, cmd.Stderr = out, out
	ran := time.Now()
	err = cmd.Run()
	out.flush()
	t.Logf("node --test web/e2e/ ran %s; screenshots in %s", time.Since(ran).Round(time.Millisecond), artifacts)
	if err != nil {
		t.Fatalf("browser tests failed (node --test web/e2e/: %v); its output is above and in %s, the platform's logs in %s",
			err, nodeLog.Name(), filepath.Join(artifacts, "logs"))
	}
}

// lineLogger passes node's output to the test log line by line (streamed
// with go test -v) and keeps all of it in a file.
type lineLogger struct {
	t    *testing.T
	file *os.File

	mu sync.Mutex
	// buf holds an unfinished line; guarded by mu.
	buf []byte
}

func (l *lineLogger) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.file.Write(b)
	l.buf = append(l.buf, b...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		l.t.Log("node: " + string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
}

func (l *lineLogger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.t.Log("node: " + string(l.buf))
		l.buf = nil
	}
}

// browserPlatform is the platform the browser tests use: the development
// upstream and the control plane in this process (the control plane
// restartable on its address and database), and the worker as a
// supervised OS process, so it can be SIGKILLed and is restarted as
// `make run` restarts it.
type browserPlatform struct {
	t          *testing.T
	url        string
	cpAddr     string
	userToken  string
	adminToken string
	upstream   *httptest.Server
	cpCfg      controlplane.Config

	cpMu sync.Mutex
	// stopCP stops the running control plane and waits for it; cpStarts
	// counts its starts. Guarded by cpMu, which also serialises restarts.
	stopCP   func()
	cpStarts int

	worker *workerProcess
}

func startBrowserPlatform(t *testing.T, logDir string) *browserPlatform {
	t.Helper()
	bin := platformtest.ClaudeBin(t)
	dir := platformtest.AgentReachableTempDir(t)
	workerBin := filepath.Join(dir, "talkide-worker")
	if out, err := exec.Command("go", "build", "-o", workerBin, "github.com/talkide/talkide/cmd/talkide-worker").CombinedOutput(); err != nil {
		t.Fatalf("build the worker: %v\n%s", err, out)
	}
	cpLog, err := os.Create(filepath.Join(logDir, "controlplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cpLog.Close() })
	log := slog.New(slog.NewTextHandler(cpLog, nil))

	// The upstream's admin API (/_dev/script) lets scenarios script the
	// model's answers (tool calls, edits, slow streams); see controlHandler.
	up := httptest.NewServer(devupstream.New(devupstream.Config{APIKey: platformtest.UpstreamAPIKey, EnableAdmin: true,
		Logger: log.With("component", "devupstream")}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)

	master, err := token.NewMasterKey("b1")
	if err != nil {
		t.Fatal(err)
	}
	cpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wAddr := freeLoopbackAddr(t)
	p := &browserPlatform{t: t, cpAddr: cpLn.Addr().String(), userToken: "tk_browser_" + token.NewID(),
		adminToken: "adm_browser_" + token.NewID(), upstream: up}
	p.url = "http://" + p.cpAddr
	dbPath := filepath.Join(dir, "cp.db")
	p.cpCfg = controlplane.Config{DBPath: dbPath, MasterKeys: []token.MasterKey{master}, Upstream: upURL,
		APIKey: platformtest.UpstreamAPIKey, WorkerURLTemplate: "http://" + wAddr, DevUserToken: p.userToken,
		AdminToken: p.adminToken, ShutdownGrace: 2 * time.Second, Logger: log.With("component", "controlplane")}
	if err := p.cpCfg.Validate(); err != nil {
		t.Fatal(err)
	}
	db, err := controlstore.OpenSQLite(context.Background(), dbPath)
	if err != nil {
		t.Fatal(err)
	}
	identity, err := mint.New(db, master, log).IssueIdentity(context.Background(), "demo", "dev", 0)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	p.startControlPlane(cpLn)
	t.Cleanup(func() {
		p.cpMu.Lock()
		defer p.cpMu.Unlock()
		if p.stopCP != nil {
			p.stopCP()
		}
	})
	wLog, err := os.Create(filepath.Join(logDir, "worker.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wLog.Close() })
	p.worker = &workerProcess{bin: workerBin, addr: wAddr, log: wLog, policy: "allow", done: make(chan struct{}),
		env: []string{
			"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
			"TALKIDE_TENANT=demo", "TALKIDE_ENV=dev", "TALKIDE_WORKER_ADDR=" + wAddr,
			"TALKIDE_WORKER_REQUEST_KEYS=" + token.FormatKey(master.Derive(token.PurposeWorkerRequest, "demo", "dev")),
			"TALKIDE_GATEWAY_BASE_URL=" + p.url, "TALKIDE_WORKER_IDENTITY_TOKEN=" + identity,
			"TALKIDE_SESSION_DIR=" + filepath.Join(dir, "sessions"), "TALKIDE_CLAUDE_BIN=" + bin,
			"TALKIDE_WORKER_ID=browser-worker", "TALKIDE_CLI_TMP_DIR=" + filepath.Join(dir, "cli-tmp"),
			"TALKIDE_SHUTDOWN_GRACE=2s",
		}}
	go p.worker.supervise()
	t.Cleanup(p.worker.stop) // before the control plane's cleanup: cleanups run last-first
	if err := p.worker.waitReady(0, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.waitControlPlane(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	return p
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startControlPlane serves the control plane on ln; cpMu held or not yet
// shared.
func (p *browserPlatform) startControlPlane(ln net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := controlplane.Run(ctx, p.cpCfg, ln); err != nil {
			p.cpCfg.Logger.Error("control plane ended", "err", err)
		}
	}()
	p.stopCP = func() { cancel(); <-done }
	p.cpStarts++
}

// restartControlPlane stops the control plane (ending every browser
// stream), waits down, and starts it again on the same address and
// database.
func (p *browserPlatform) restartControlPlane(down time.Duration) error {
	p.cpMu.Lock()
	defer p.cpMu.Unlock()
	if p.stopCP != nil {
		p.stopCP()
		p.stopCP = nil
	}
	time.Sleep(down)
	ln, err := net.Listen("tcp", p.cpAddr)
	if err != nil {
		return fmt.Errorf("listen again on %s: %w", p.cpAddr, err)
	}
	p.startControlPlane(ln)
	return p.waitControlPlane(30 * time.Second)
}

func (p *browserPlatform) waitControlPlane(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(p.url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("the control plane did not answer /healthz within %s", limit)
}

// workerProcess runs the worker binary and starts it again whenever it
// ends, like the pod (or `make run`) would: after a second, or what a
// kill asked for.
type workerProcess struct {
	bin  string
	addr string
	env  []string
	log  *os.File
	done chan struct{}

	mu sync.Mutex
	// cmd is the running process and exited closes when it has ended;
	// starts counts starts; policy is TALKIDE_PERMISSION_POLICY for the
	// next start; delay the pause before the next start; stopping ends
	// the supervision. All guarded by mu.
	cmd      *exec.Cmd
	exited   chan struct{}
	starts   int
	policy   string
	delay    time.Duration
	stopping bool
}

func (w *workerProcess) supervise() {
	defer close(w.done)
	for {
		w.mu.Lock()
		if w.stopping {
			w.mu.Unlock()
			return
		}
		cmd := exec.Command(w.bin)
		cmd.Env = append(slices.Clone(w.env), "TALKIDE_PERMISSION_POLICY="+w.policy)
		cmd.Stdout, cmd.Stderr = w.log, w.log
		fmt.Fprintf(w.log, "=== browser test: starting the worker (permission policy %s)\n", w.policy)
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(w.log, "=== browser test: start the worker: %v\n", err)
			w.mu.Unlock()
			return
		}
		exited := make(chan struct{})
		w.cmd, w.exited, w.delay = cmd, exited, time.Second
		w.starts++
		w.mu.Unlock()
		err := cmd.Wait()
		close(exited)
		w.mu.Lock()
		delay, stopping := w.delay, w.stopping
		w.mu.Unlock()
		if stopping {
			return
		}
		fmt.Fprintf(w.log, "=== browser test: the worker ended (%v); starting it again in %s\n", err, delay)
		time.Sleep(delay)
	}
}

// end signals the running worker and waits until it has exited; the
// supervisor then starts the next one after down. It returns the pid that
// ended.
func (w *workerProcess) end(sig syscall.Signal, down time.Duration, change func()) int {
	w.mu.Lock()
	cmd, exited := w.cmd, w.exited
	w.delay = down
	if change != nil {
		change()
	}
	w.mu.Unlock()
	_ = cmd.Process.Signal(sig)
	<-exited
	return cmd.Process.Pid
}

// waitReady waits until a worker other than pid old runs and answers
// /readyz.
func (w *workerProcess) waitReady(old int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		cmd := w.cmd
		w.mu.Unlock()
		if cmd != nil && cmd.Process.Pid != old {
			if resp, err := http.Get("http://" + w.addr + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return nil
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the worker was not ready within %s (see its log, %s)", limit, w.log.Name())
}

func (w *workerProcess) pid() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cmd == nil {
		return 0
	}
	return w.cmd.Process.Pid
}

func (w *workerProcess) stop() {
	w.mu.Lock()
	w.stopping = true
	cmd, exited := w.cmd, w.exited
	w.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	<-w.done
}

// controlHandler is the browser tests' control server (TALKIDE_CONTROL_URL):
//
//	GET  /health                    {"ok": true}
//	GET  /state                     the platform: url, worker pid and starts, permission policy, control-plane starts
//	POST /reset                     permission policy allow, the user's default budget, an empty upstream script
//	POST /kill-worker               {"down_ms": 1000}: SIGKILL the worker; answers once its successor is ready
//	POST /restart-controlplane      {"down_ms": 0}: stop the control plane, start it again on the same address and database
//	POST /set-user-limit            {"usd": "0.000001"} sets the dev user's monthly limit; {"usd": ""} removes it
//	POST /set-permission-policy     {"policy": "ask"|"allow"}: restart the worker (SIGTERM) with that policy
//	POST /upstream/script           a JSON array of scripted model answers (devupstream's /_dev/script)
//	POST /upstream/reset            forget the script and the recorded requests
//
// Every answer is JSON; a failure is {"error": {"type", "message"}}.
func (p *browserPlatform) controlHandler() http.Handler {
	mux := http.NewServeMux()
	log := p.cpCfg.Logger.With("component", "browser-test-control")
	h := func(f httpapi.HandlerFunc) http.Handler { return httpapi.Handle(log, f) }
	state := func() map[string]any {
		p.worker.mu.Lock()
		policy, starts := p.worker.policy, p.worker.starts
		p.worker.mu.Unlock()
		p.cpMu.Lock()
		cpStarts := p.cpStarts
		p.cpMu.Unlock()
		return map[string]any{"url": p.url, "worker_pid": p.worker.pid(), "worker_starts": starts,
			"permission_policy": policy, "controlplane_starts": cpStarts}
	}
	mux.Handle("GET /health", h(func(w http.ResponseWriter, r *http.Request) error {
		httpapi.WriteJSON(w, http.StatusOK, map[string]bool{"ok": true})
		return nil
	}))
	mux.Handle("GET /state", h(func(w http.ResponseWriter, r *http.Request) error {
		httpapi.WriteJSON(w, http.StatusOK, state())
		return nil
	}))
	mux.Handle("POST /kill-worker", h(func(w http.ResponseWriter, r *http.Request) error {
		var in struct {
			DownMS *int `json:"down_ms"`
		}
		if err := decodeControl(w, r, &in); err != nil {
			return err
		}
		down := time.Second
		if in.DownMS != nil {
			down = time.Duration(*in.DownMS) * time.Millisecond
		}
		t0 := time.Now()
		old := p.worker.end(syscall.SIGKILL, down, nil)
		if err := p.worker.waitReady(old, 60*time.Second); err != nil {
			return httpapi.Wrap(http.StatusInternalServerError, "internal_error", err.Error(), err)
		}
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"killed_pid": old, "pid": p.worker.pid(),
			"took_ms": time.Since(t0).Milliseconds()})
		return nil
	}))
	mux.Handle("POST /restart-controlplane", h(func(w http.ResponseWriter, r *http.Request) error {
		var in struct {
			DownMS int `json:"down_ms"`
		}
		if err := decodeControl(w, r, &in); err != nil {
			return err
		}
		t0 := time.Now()
		if err := p.restartControlPlane(time.Duration(in.DownMS) * time.Millisecond); err != nil {
			return httpapi.Wrap(http.StatusInternalServerError, "internal_error", err.Error(), err)
		}
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"took_ms": time.Since(t0).Milliseconds()})
		return nil
	}))
	mux.Handle("POST /set-user-limit", h(func(w http.ResponseWriter, r *http.Request) error {
		var in struct {
			USD *string `json:"usd"`
		}
		if err := decodeControl(w, r, &in); err != nil {
			return err
		}
		status, body, err := p.setUserLimit(in.USD)
		if err != nil {
			return httpapi.Wrap(http.StatusBadGateway, "upstream_error", err.Error(), err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(body)
		return nil
	}))
	mux.Handle("POST /set-permission-policy", h(func(w http.ResponseWriter, r *http.Request) error {
		var in struct {
			Policy string `json:"policy"`
		}
		if err := decodeControl(w, r, &in); err != nil {
			return err
		}
		if in.Policy != "ask" && in.Policy != "allow" {
			return httpapi.BadRequest(`policy: want "ask" or "allow"`)
		}
		if err := p.setPolicy(in.Policy); err != nil {
			return httpapi.Wrap(http.StatusInternalServerError, "internal_error", err.Error(), err)
		}
		httpapi.WriteJSON(w, http.StatusOK, state())
		return nil
	}))
	mux.Handle("POST /reset", h(func(w http.ResponseWriter, r *http.Request) error {
		if err := p.setPolicy("allow"); err != nil {
			return httpapi.Wrap(http.StatusInternalServerError, "internal_error", err.Error(), err)
		}
		if status, body, err := p.setUserLimit(nil); err != nil || status >= 300 {
			return httpapi.Errorf(http.StatusInternalServerError, "internal_error", "remove the user's limit: %d %s %v", status, body, err)
		}
		if err := p.upstreamAdmin("/_dev/reset", nil, nil); err != nil {
			return httpapi.Wrap(http.StatusInternalServerError, "internal_error", err.Error(), err)
		}
		httpapi.WriteJSON(w, http.StatusOK, state())
		return nil
	}))
	mux.Handle("POST /upstream/script", h(func(w http.ResponseWriter, r *http.Request) error {
		body, err := httpapi.ReadBody(w, r, 4<<20)
		if err != nil {
			return err
		}
		var out json.RawMessage
		if err := p.upstreamAdmin("/_dev/script", body, &out); err != nil {
			return httpapi.BadRequest("%v", err)
		}
		httpapi.WriteJSON(w, http.StatusOK, out)
		return nil
	}))
	mux.Handle("POST /upstream/reset", h(func(w http.ResponseWriter, r *http.Request) error {
		if err := p.upstreamAdmin("/_dev/reset", nil, nil); err != nil {
			return httpapi.Wrap(http.StatusInternalServerError, "internal_error", err.Error(), err)
		}
		httpapi.WriteJSON(w, http.StatusOK, map[string]bool{"ok": true})
		return nil
	}))
	return httpapi.Routes(mux, log)
}

// decodeControl reads an optional JSON body into v.
func decodeControl(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := httpapi.ReadBody(w, r, 64<<10)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return httpapi.BadRequest("body: %v", err)
	}
	return nil
}

// setPolicy restarts the worker with policy unless it runs with it.
func (p *browserPlatform) setPolicy(policy string) error {
	p.worker.mu.Lock()
	same := p.worker.policy == policy
	p.worker.mu.Unlock()
	if same {
		return nil
	}
	old := p.worker.end(syscall.SIGTERM, 0, func() { p.worker.policy = policy })
	return p.worker.waitReady(old, 60*time.Second)
}

// setUserLimit sets (usd non-empty) or removes (nil or "") the dev user's
// monthly limit through the budget admin API and returns its answer.
func (p *browserPlatform) setUserLimit(usd *string) (int, []byte, error) {
	method, body := http.MethodDelete, ""
	if usd != nil && *usd != "" {
		b, _ := json.Marshal(map[string]string{"limit_usd": *usd})
		method, body = http.MethodPut, string(b)
	}
	req, _ := http.NewRequest(method, p.url+"/api/admin/budget/users/dev/limit", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+p.adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// upstreamAdmin posts body to the development upstream's admin path and
// decodes its JSON answer into out (when non-nil).
func (p *browserPlatform) upstreamAdmin(path string, body []byte, out any) error {
	resp, err := http.Post(p.upstream.URL+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("development upstream %s: %d %s", path, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}
