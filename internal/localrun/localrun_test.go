package localrun

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/testlane"
	"github.com/talkide/talkide/internal/worker/claudecli"
)

// TestRunServesTheREADMEExample builds the real binaries, runs the platform
// as `make run` does (separate processes, development upstream), sends the
// README's message through the browser API and waits for the answer quoting
// the command's output; then it stops the platform and checks no process of
// it is left.
func TestRunServesTheREADMEExample(t *testing.T) {
	testlane.NeedsCLI(t)
	claude, err := claudecli.Find()
	if err != nil {
		t.Fatal(err)
	}
	const adminToken = "admin-token-for-the-smoke-test-0123456789"
	r := startRun(t, claude, "TALKIDE_ADMIN_TOKEN="+adminToken)
	bin, addr, state, out, tok, stop := r.bin, r.addr, r.state, r.out, r.tok, r.stop
	defer stop()
	if !strings.Contains(out.String(), "http://"+addr+"/#token="+tok) {
		t.Errorf("banner lacks the URL to open: %q", out.String())
	}
	// The banner's command for a second user is pasted as printed.
	if add := "TALKIDE_STATE_DIR=" + state + " " + filepath.Join(bin, "talkide") + " user add NAME   (prints"; !strings.Contains(out.String(), add) {
		t.Errorf("banner's add-user line is not %q: %q", add, out.String())
	}
	// The banner says how to meet permission requests (the default policy
	// asks nothing).
	if !strings.Contains(out.String(), "Permissions:        commands run in the agent's jail without asking; `TALKIDE_PERMISSION_POLICY=ask make run` asks you first") {
		t.Errorf("banner does not say how to be asked for permission: %q", out.String())
	}
	base := "http://" + addr
	call := func(method, path, body string) (int, []byte) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if st, _ := call("GET", "/healthz", ""); st != 200 {
		t.Fatalf("healthz: %d", st)
	}
	// The user's own TALKIDE_* settings reach the processes: the admin API
	// is on because TALKIDE_ADMIN_TOKEN was set.
	areq, _ := http.NewRequest("GET", base+"/api/admin/budget/users/dev", nil)
	areq.Header.Set("Authorization", "Bearer "+adminToken)
	if aresp, err := http.DefaultClient.Do(areq); err != nil || aresp.StatusCode != 200 {
		t.Errorf("admin API with TALKIDE_ADMIN_TOKEN passed to make run: %v %v", aresp, err)
	} else {
		aresp.Body.Close()
	}
	st, b := call("POST", "/api/conversations", `{"tenant":"demo","env":"dev"}`)
	var conv struct{ ID string }
	if st != 201 || json.Unmarshal(b, &conv) != nil || conv.ID == "" {
		t.Fatalf("create conversation: %d %s", st, b)
	}
	if st, b := call("POST", "/api/conversations/"+conv.ID+"/messages", "{\"text\":\"please run `echo hello-from-talkide`\"}"); st != 202 {
		t.Fatalf("send: %d %s", st, b)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer scancel()
	req, _ := http.NewRequestWithContext(sctx, "GET", base+"/api/conversations/"+conv.ID+"/stream", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var quoted bool
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "data:") && strings.Contains(line, `"type":"assistant_text"`) && strings.Contains(line, "hello-from-talkide") {
			quoted = true
		}
		if strings.HasPrefix(line, "event: turn_") && line != "event: turn_started" {
			break
		}
	}
	if !quoted {
		t.Fatalf("no assistant message quoting hello-from-talkide; logs:\n%s", logs(state))
	}
	resp.Body.Close()

	// The agent tries to read the platform's secrets: every process's
	// environment, and the master key in the state dir.
	probe := "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f 2>/dev/null; done | grep -E '^(TALKIDE_MASTER_KEYS|TALKIDE_WORKER_IDENTITY_TOKEN|TALKIDE_WORKER_REQUEST_KEYS|TALKIDE_DEV_USER_TOKEN)=' | wc -l; cat " + filepath.Join(state, "master.key") + "; cat " + filepath.Join(state, "dev-user-token") + "; echo probe-done"
	body, _ := json.Marshal(map[string]string{"text": "please run `" + probe + "`"})
	if st, b := call("POST", "/api/conversations/"+conv.ID+"/messages", string(body)); st != 202 {
		t.Fatalf("send probe: %d %s", st, b)
	}
	result := waitToolResult(t, base, tok, conv.ID, "probe-done")
	master, _ := os.ReadFile(filepath.Join(state, "master.key"))
	userTok, _ := os.ReadFile(filepath.Join(state, "dev-user-token"))
	if !slices.Contains(strings.Split(result, "\n"), "0") {
		t.Errorf("the agent read secrets from process environments: %q", result)
	}
	for _, secret := range []string{strings.TrimSpace(string(master)), strings.TrimSpace(string(userTok))} {
		if secret != "" && strings.Contains(result, secret) {
			t.Errorf("the agent read a secret file of the state dir")
		}
	}

	stop()
	// Nothing of the platform may outlive it: no binary of bin/ and no CLI
	// started for its session volume.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left := processesMentioning(bin, state)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left after stop: %v", left)
		}
	}
}

func logs(state string) string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(state, "logs", "*.log"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		b.WriteString("== " + f + "\n" + string(data) + "\n")
	}
	return b.String()
}

// processesMentioning lists /proc entries whose command line or working
// directory mentions one of the paths.
func processesMentioning(paths ...string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cwd, _ := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		for _, p := range paths {
			if bytes.Contains(cmdline, []byte(p)) || strings.HasPrefix(cwd, p) {
				out = append(out, e.Name()+":"+strings.ReplaceAll(string(cmdline), "\x00", " "))
				break
			}
		}
	}
	return out
}

// waitToolResult reads the conversation's stream from the start until a
// tool_result containing marker, and returns its content.
func waitToolResult(t *testing.T, base, tok, conv, marker string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/api/conversations/"+conv+"/stream", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || !strings.Contains(data, `"type":"tool_result"`) {
			continue
		}
		var ev struct {
			Data struct {
				Content string `json:"content"`
			} `json:"data"`
		}
		if json.Unmarshal([]byte(data), &ev) == nil && strings.Contains(ev.Data.Content, marker) {
			return ev.Data.Content
		}
	}
	t.Fatalf("no tool result with %q", marker)
	return ""
}

// TestRunRefusesATakenAddressAndAStateDirInUse guards against a run that
// prints a banner while its control plane cannot bind, and against two runs
// sharing one state dir (two workers on one session volume).
func TestRunRefusesATakenAddressAndAStateDirInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	out := &platformtest.LogBuffer{}
	err = Run(context.Background(), Config{StateDir: t.TempDir(), HTTPAddr: ln.Addr().String(), BinDir: t.TempDir(), Out: out, Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), "TALKIDE_HTTP_ADDR") {
		t.Errorf("taken address: got %v, want an error naming TALKIDE_HTTP_ADDR", err)
	}
	if strings.Contains(out.String(), "TalkIDE is running") {
		t.Error("banner printed although the platform cannot run")
	}
	state := t.TempDir()
	unlock, err := lockStateDir(state)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	err = Run(context.Background(), Config{StateDir: state, HTTPAddr: "127.0.0.1:0", BinDir: t.TempDir(), Out: out, Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "another TalkIDE run uses the state dir") {
		t.Errorf("state dir in use: got %v", err)
	}
}

// TestRunStopsAtOnceOnAConfigurationError: a control plane that refuses its
// configuration exits with contract.ExitConfig and is not restarted; Run
// fails at once quoting what that run wrote, not the log of earlier runs.
func TestRunStopsAtOnceOnAConfigurationError(t *testing.T) {
	bin := buildBinaries(t)
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	if err := os.MkdirAll(filepath.Join(state, "logs"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "logs", "controlplane.log"), []byte("a line from an earlier run\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = Run(context.Background(), Config{StateDir: state, HTTPAddr: addr, BinDir: bin, Out: &platformtest.LogBuffer{},
		ExtraEnv: []string{"TALKIDE_BUDGET_PREDICT=maybe"}, Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "controlplane refused its configuration") || !strings.Contains(err.Error(), `TALKIDE_BUDGET_PREDICT "maybe"`) {
		t.Fatalf("got %v, want the control plane's configuration error", err)
	}
	if strings.Contains(err.Error(), "earlier run") {
		t.Errorf("error quotes an earlier run's log: %v", err)
	}
	log, err := os.ReadFile(filepath.Join(state, "logs", "controlplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "TALKIDE_BUDGET_PREDICT"); n != 1 {
		t.Errorf("the control plane reported its configuration error %d times, want once (no restarts):\n%s", n, log)
	}
}

// buildBinaries builds the platform's binaries into a temp dir and returns
// it.
func buildBinaries(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "github.com/talkide/talkide/cmd/...")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestSuperviseStopsInReverseOrder: the process started last (the worker)
// is stopped, and has exited, before the one started before it (the
// control plane it reports to) is sent SIGTERM.
func TestSuperviseStopsInReverseOrder(t *testing.T) {
	dir := t.TempDir()
	record := filepath.Join(dir, "stops")
	var procs []*proc
	for _, name := range []string{"first", "second", "third"} {
		script := filepath.Join(dir, name)
		linger := "" // the last one takes its time to exit: the others must wait for it
		if name == "third" {
			linger = "sleep 0.3; "
		}
		body := "#!/bin/sh\ntrap '" + linger + "echo " + name + " >> " + record + "; exit 0' TERM\n" +
			"touch " + script + ".ready\nwhile :; do sleep 0.05; done\n"
		if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, &proc{name: name, bin: script, logPath: filepath.Join(dir, name+".log"), log: slog.New(slog.DiscardHandler)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		supervise(ctx, procs)
	}()
	// Wait until each has set its trap; the deadline guards against a
	// hang and measures nothing.
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range procs {
		for {
			if _, err := os.Stat(p.bin + ".ready"); err == nil {
				break
			}
			if time.Now().After(deadline) {
				cancel()
				t.Fatalf("%s never started", p.name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	cancel()
	<-done
	got, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "third\nsecond\nfirst\n" {
		t.Errorf("stop order:\n%s\nwant third, second, first", got)
	}
}

// run is a platform started by startRun.
type run struct {
	bin, addr, state string
	out              *platformtest.LogBuffer
	// tok is the user token the banner printed.
	tok string
	// stop cancels the run and waits for it (once; later calls do nothing).
	stop func()
}

// startRun builds the binaries and runs the platform as `make run` does,
// with the CLI claude and extra TALKIDE_* settings, and waits for its
// banner. The test fails if it ends early or prints no banner.
func startRun(t *testing.T, claude string, extraEnv ...string) *run {
	t.Helper()
	return launch(t, Config{StateDir: platformtest.AgentReachableTempDir(t), BinDir: buildBinaries(t),
		ExtraEnv: append([]string{"TALKIDE_CLAUDE_BIN=" + claude}, extraEnv...)})
}

// launch runs the platform with cfg on a free address (its output and
// logger set here) and waits for its banner. The test fails if it ends
// early or prints no banner.
func launch(t *testing.T, cfg Config) *run {
	t.Helper()
	r := &run{bin: cfg.BinDir, state: cfg.StateDir, out: &platformtest.LogBuffer{}}
	var err error
	if r.addr, err = freeAddr(); err != nil {
		t.Fatal(err)
	}
	cfg.HTTPAddr, cfg.Out, cfg.Logger = r.addr, r.out, slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	stopped := false
	r.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("Run did not return within 60 s of cancellation")
		}
	}
	tokRe := regexp.MustCompile(`User token:\s+(\S+)`)
	for deadline := time.Now().Add(90 * time.Second); r.tok == ""; time.Sleep(100 * time.Millisecond) {
		if m := tokRe.FindStringSubmatch(r.out.String()); m != nil {
			r.tok = m[1]
		}
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("Run returned early: %v; logs:\n%s", err, logs(r.state))
		default:
		}
		if time.Now().After(deadline) {
			r.stop()
			t.Fatalf("no banner within 90 s; output %q; logs:\n%s", r.out.String(), logs(r.state))
		}
	}
	return r
}

// TestWorkerWithADeadIdentityIsNotRestarted: a worker that exits with
// contract.ExitIdentity (its identity token revoked or expired) would
// present the same token again: the supervisor does not restart it.
func TestWorkerWithADeadIdentityIsNotRestarted(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "worker")
	count := filepath.Join(dir, "starts")
	body := "#!/bin/sh\necho x >> " + count + "\nexit " + strconv.Itoa(contract.ExitIdentity) + "\n"
	if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
		t.Fatal(err)
	}
	p := &proc{name: "worker", bin: script, logPath: filepath.Join(dir, "worker.log"), log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p.loop(ctx) // returns by itself when it does not restart
	if ctx.Err() != nil {
		t.Fatal("the supervisor kept restarting a worker whose identity is gone")
	}
	starts, _ := os.ReadFile(count)
	if n := strings.Count(string(starts), "x"); n != 1 || !p.misconfigured.Load() {
		t.Fatalf("started %d times (misconfigured %v), want once", n, p.misconfigured.Load())
	}
}

// A serving process ended from outside comes back at once however often
// it happens (the issue 28 chaos run waited 8–11 s after repeated worker
// kills); only a process that keeps ending at its start backs off.
// TestPermissionNote: the banner names the policy the run's environment
// sets, the last setting winning as in the worker's environment.
func TestPermissionNote(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{nil, "without asking; `TALKIDE_PERMISSION_POLICY=ask make run` asks you first"},
		{[]string{"TALKIDE_PERMISSION_POLICY=ask"}, "every shell command waits for your Allow or Deny"},
		{[]string{"TALKIDE_PERMISSION_POLICY=ask", "TALKIDE_PERMISSION_POLICY=allow"}, "without asking"},
	} {
		if got := permissionNote(tc.env); !strings.Contains(got, tc.want) {
			t.Errorf("permissionNote(%q) = %q, want it to say %q", tc.env, got, tc.want)
		}
	}
}

func TestRestartDelay(t *testing.T) {
	var d time.Duration
	for i := range 6 {
		d = restartDelay(5*time.Second, d) // killed after serving 5 s
		if d != restartMin {
			t.Fatalf("kill %d of a serving process: wait %v, want %v", i+1, d, restartMin)
		}
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, restartMax, restartMax}
	d = 0
	for i, w := range want {
		d = restartDelay(100*time.Millisecond, d) // ends at its start
		if d != w {
			t.Fatalf("crash %d at start: wait %v, want %v", i+1, d, w)
		}
	}
	if d = restartDelay(healthyAfter, d); d != restartMin {
		t.Fatalf("a run of %v after crashes: wait %v, want %v", healthyAfter, d, restartMin)
	}
}
