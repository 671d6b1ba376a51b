package main

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
	"net/http/pprof"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/controlplane/workerclient"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/harden"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker"
	"github.com/talkide/talkide/internal/worker/sandbox"
)

// modelCalls times the calls of the development upstream (calls.go).
var modelCalls = &callLog{}

const (
	tenant, env    = "demo", "dev"
	upstreamAPIKey = "sk-ant-bench-upstream-key"
	// envChild makes this binary run as the worker (childMain).
	envChild = "TALKIDE_BENCH_WORKER_CHILD"
)

// childConfig is what the bench gives its worker process.
type childConfig struct {
	RequestKey, GatewayURL, IdentityToken string
	SessionDir, ClaudeBin, HostUIDDir     string
	CLITmpDir, Containment, PprofAddr     string
	AgentReadPaths, AgentUser             string
	MaxProcesses, MaxConversations        int
	UIDCount                              uint32
}

// childMain runs the worker in this process, as cmd/talkide-worker does
// (hardened, worker.Run), from the configuration the bench gives it. It
// differs only in taking a larger agent uid range than the default 100,000
// (a host's whole range would be full) and, on request, serving pprof.
func childMain() {
	if err := harden.Process(); err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		os.Exit(1)
	}
	var cc childConfig
	if err := json.Unmarshal([]byte(os.Getenv(envChild)), &cc); err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		os.Exit(1)
	}
	os.Unsetenv(envChild)
	keys, err := token.ParseKeys(cc.RequestKey)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		os.Exit(1)
	}
	gw, _ := url.Parse(cc.GatewayURL)
	cfg := worker.Config{
		Tenant: tenant, Env: env, Addr: "127.0.0.1:0", RequestKeys: keys, GatewayBaseURL: gw, IdentityToken: cc.IdentityToken,
		SessionDir: cc.SessionDir, ClaudeBin: cc.ClaudeBin, HostUIDDir: cc.HostUIDDir, CLITmpDir: cc.CLITmpDir,
		MaxProcesses: cc.MaxProcesses, MaxConversations: cc.MaxConversations, MaxConversationsPerUser: cc.MaxConversations,
		AgentUser:     cc.AgentUser,
		AgentUIDRange: sandbox.UIDRange{First: sandbox.DefaultUIDs.First, Count: cc.UIDCount},
		Logger:        slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	getenv := func(k string) string {
		switch k {
		case "TALKIDE_CONTAINMENT":
			return cc.Containment
		case "TALKIDE_AGENT_READ_PATHS":
			return cc.AgentReadPaths
		}
		return ""
	}
	if err := worker.ParseContainment(getenv, &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		os.Exit(1)
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		os.Exit(1)
	}
	if cc.PprofAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		go http.ListenAndServe(cc.PprofAddr, mux)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		os.Exit(1)
	}
	// The bench reads the address from this line.
	fmt.Fprintf(os.Stderr, "{\"msg\":\"bench worker listening\",\"addr\":%q}\n", ln.Addr().String())
	ctx, stop := signalContext()
	err = worker.Run(ctx, cfg, ln)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		os.Exit(1)
	}
}

// platform is a control plane (in this process), a development upstream (in
// this process) and one worker process.
type platform struct {
	dir       string
	master    token.MasterKey
	userToken string
	upstream  *httptest.Server
	cpURL     string
	stopCP    func()
	w         *workerProcess
	wc        *workerclient.Client
	hc        *http.Client
}

// startPlatform starts the parts; sessionDir is the worker's session volume.
func startPlatform(dir, sessionDir string, cc childConfig) (*platform, error) {
	p := &platform{dir: dir, userToken: "tk_bench_" + token.NewID(),
		hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxConnsPerHost: 0}}}
	var err error
	if p.master, err = token.NewMasterKey("b1"); err != nil {
		return nil, err
	}
	log := slog.New(slog.DiscardHandler)
	p.upstream = httptest.NewServer(modelCalls.wrap(devupstream.New(devupstream.Config{APIKey: upstreamAPIKey})))
	cpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p.cpURL = "http://" + cpLn.Addr().String()
	dbPath := filepath.Join(dir, "cp.db")
	db, err := controlstore.OpenSQLite(context.Background(), dbPath)
	if err != nil {
		return nil, err
	}
	identity, err := mint.New(db, p.master, log).IssueIdentity(context.Background(), tenant, env, 0)
	db.Close()
	if err != nil {
		return nil, err
	}
	cc.RequestKey = token.FormatKey(p.master.Derive(token.PurposeWorkerRequest, tenant, env))
	cc.GatewayURL, cc.IdentityToken, cc.SessionDir = p.cpURL, identity, sessionDir
	cc.HostUIDDir, cc.CLITmpDir = filepath.Join(dir, "uids"), filepath.Join(dir, "cli-tmp")
	if err := os.MkdirAll(sessionDir, 0o711); err != nil {
		return nil, err
	}
	if p.w, err = startWorkerProcess(cc); err != nil {
		return nil, err
	}
	base, _ := url.Parse(p.w.URL)
	p.wc = workerclient.New(base, tenant, env, p.master.Derive(token.PurposeWorkerRequest, tenant, env))

	upURL, _ := url.Parse(p.upstream.URL)
	cpCfg := controlplane.Config{
		DBPath: dbPath, MasterKeys: []token.MasterKey{p.master}, Upstream: upURL, APIKey: upstreamAPIKey,
		WorkerURLTemplate: p.w.URL, DevUserToken: p.userToken, Logger: log,
		MaxConversationsPerUser: cc.MaxConversations, MaxConversationsPerTenantEnv: cc.MaxConversations,
	}
	if err := cpCfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := controlplane.Run(ctx, cpCfg, cpLn); err != nil {
			fmt.Fprintln(os.Stderr, "control plane:", err)
		}
	}()
	p.stopCP = func() { cancel(); <-done }
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get(p.cpURL + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("control plane did not start")
		}
	}
	return p, nil
}

func (p *platform) close() {
	if p.stopCP != nil {
		p.stopCP()
	}
	if p.w != nil {
		p.w.stop()
	}
	p.upstream.Close()
}

// api calls the browser API; out, when set, receives the JSON answer.
func (p *platform) api(method, path string, in, out any) (int, error) {
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, p.cpURL+path, body)
	req.Header.Set("Authorization", "Bearer "+p.userToken)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	if out != nil {
		return resp.StatusCode, json.Unmarshal(b, out)
	}
	return resp.StatusCode, nil
}

// newConversation creates a conversation through the browser API.
func (p *platform) newConversation() (string, error) {
	var out struct {
		ID string `json:"id"`
	}
	_, err := p.api("POST", "/api/conversations", map[string]string{"tenant": tenant, "env": env}, &out)
	return out.ID, err
}

// workerProcess is the worker running as a child process (this binary in
// child mode).
type workerProcess struct {
	URL    string
	cmd    *exec.Cmd
	exited chan struct{}

	mu sync.Mutex
	// tail is the end of the worker's stderr; guarded by mu.
	tail []string
}

func startWorkerProcess(cc childConfig) (*workerProcess, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(cc)
	cmd := exec.Command(self)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TALKIDE_") && !strings.HasPrefix(kv, "ANTHROPIC_") && !strings.HasPrefix(kv, "CLAUDE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, envChild+"="+string(b))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &workerProcess{cmd: cmd, exited: make(chan struct{})}
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			w.mu.Lock()
			w.tail = append(w.tail, line)
			if len(w.tail) > 40 {
				w.tail = w.tail[1:]
			}
			w.mu.Unlock()
			var rec struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "bench worker listening" {
				listening <- rec.Addr
			}
		}
		cmd.Wait()
		close(w.exited)
	}()
	select {
	case addr := <-listening:
		w.URL = "http://" + addr
	case <-w.exited:
		return nil, fmt.Errorf("worker exited while starting:\n%s", w.log())
	case <-time.After(2 * time.Minute):
		w.stop()
		return nil, fmt.Errorf("worker did not start:\n%s", w.log())
	}
	// Ready once it answers /readyz.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get(w.URL + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return w, nil
			}
		}
		if time.Now().After(deadline) {
			w.stop()
			return nil, fmt.Errorf("worker not ready:\n%s", w.log())
		}
	}
}

func (w *workerProcess) log() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.tail, "\n")
}

func (w *workerProcess) pid() int { return w.cmd.Process.Pid }

func (w *workerProcess) stop() {
	select {
	case <-w.exited:
		return
	default:
	}
	_ = w.cmd.Process.Signal(os.Interrupt)
	select {
	case <-w.exited:
	case <-time.After(time.Minute):
		_ = w.cmd.Process.Kill()
		<-w.exited
	}
}

// procStats reads a process's CPU time (utime+stime), resident memory and
// open files from /proc.
type procStats struct {
	CPU   time.Duration
	RSS   int64 // bytes
	Files int
}

func readProc(pid int) (procStats, error) {
	var st procStats
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, err
	}
	// Fields after the command name (which may hold spaces) in parentheses.
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+2:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stt, _ := strconv.ParseInt(f[12], 10, 64)
	st.CPU = time.Duration(ut+stt) * time.Second / clockTicks
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	for line := range strings.SplitSeq(string(s), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			st.RSS = kb << 10
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return st, err
	}
	st.Files = len(fds)
	return st, nil
}

// clockTicks is USER_HZ, the unit of utime and stime (100 on Linux).
const clockTicks = 100

// idleUsage measures pid's CPU over d of idleness as a share of one core,
// and its memory and open files at the end.
func idleUsage(pid int, d time.Duration) (pct float64, end procStats, err error) {
	a, err := readProc(pid)
	if err != nil {
		return 0, end, err
	}
	t0 := time.Now()
	time.Sleep(d)
	end, err = readProc(pid)
	if err != nil {
		return 0, end, err
	}
	return 100 * float64(end.CPU-a.CPU) / float64(time.Since(t0)), end, nil
}
