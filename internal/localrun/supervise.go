package localrun

import (
	"context"
	"github.com/talkide/talkide/internal/contract"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// proc is one supervised process.
type proc struct {
	name    string
	bin     string
	env     []string
	logPath string
	log     *slog.Logger
	// exits counts how often the process ended on its own.
	exits atomic.Int32
	// logStart is the size of the log when the last run started: what
	// that run wrote comes after it.
	logStart atomic.Int64
	// misconfigured is set when the process exited with
	// contract.ExitConfig or contract.ExitIdentity; it is not restarted
	// then.
	misconfigured atomic.Bool
}

// childEnv returns the parent's environment without any ANTHROPIC_* or
// TALKIDE_* variable, plus extra: each process gets exactly the secrets it
// is meant to have.
func childEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "ANTHROPIC_") || strings.HasPrefix(kv, "TALKIDE_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// supervise runs every proc, restarting each when it exits (with backoff),
// until ctx ends. Then it stops them in the reverse of their order, each
// only once the ones after it have exited (the worker before the control
// plane it reports to, the control plane before the upstream it calls):
// SIGTERM to the process group, up to 30 s, then SIGKILL.
func supervise(ctx context.Context, procs []*proc) {
	cancels := make([]context.CancelFunc, len(procs))
	exited := make([]chan struct{}, len(procs))
	for i, p := range procs {
		pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		cancels[i], exited[i] = cancel, make(chan struct{})
		go func() {
			defer close(exited[i])
			p.loop(pctx)
		}()
	}
	<-ctx.Done()
	for i := len(procs) - 1; i >= 0; i-- {
		cancels[i]()
		<-exited[i]
	}
}

// Restart delays (restartDelay).
const (
	// restartMin is the wait before restarting a process that had run
	// for at least healthyAfter: it was serving, and was ended from
	// outside (killed, out of memory), so it comes back at once however
	// often that happens.
	restartMin = 200 * time.Millisecond
	// restartMax caps the wait for a process that keeps ending within
	// healthyAfter of its start (a crash at start), doubling each time.
	restartMax   = 10 * time.Second
	healthyAfter = 3 * time.Second
)

// restartDelay is how long to wait before starting a process again that
// ended after running for ran, when the wait before its last start was
// prev (0 for the first end): restartMin after a run of healthyAfter or
// more, else prev doubled (from a second), capped at restartMax. Only
// crashes at start back off: repeated kills of a serving worker (a chaos
// run, a node under memory pressure) each restart it within moments.
func restartDelay(ran, prev time.Duration) time.Duration {
	if ran >= healthyAfter {
		return restartMin
	}
	return min(max(2*prev, time.Second), restartMax)
}

func (p *proc) loop(ctx context.Context) {
	var backoff time.Duration
	for ctx.Err() == nil {
		started := time.Now()
		err := p.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		p.exits.Add(1)
		if exitErr, ok := err.(*exec.ExitError); ok && exitErr.ExitCode() == contract.ExitConfig {
			p.misconfigured.Store(true)
			p.log.Error("process refused its configuration; not restarting it", "log", p.logPath)
			return
		}
		if exitErr, ok := err.(*exec.ExitError); ok && exitErr.ExitCode() == contract.ExitIdentity {
			// Started again it would present the same dead token.
			p.misconfigured.Store(true)
			p.log.Error("the worker's identity token was revoked or expired; not restarting it (restart talkide run for a new one)", "log", p.logPath)
			return
		}
		backoff = restartDelay(time.Since(started), backoff)
		p.log.Warn("process exited; restarting", "err", err, "in", backoff.String(), "log", p.logPath)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
	}
}

func (p *proc) runOnce(ctx context.Context) error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	if st, err := logf.Stat(); err == nil {
		p.logStart.Store(st.Size())
	}
	cmd := exec.Command(p.bin)
	cmd.Env = childEnv(p.env)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return err
	}
	p.log.Info("process started", "pid", cmd.Process.Pid)
	waitc := make(chan error, 1)
	go func() { waitc <- cmd.Wait() }()
	select {
	case err := <-waitc:
		return err
	case <-ctx.Done():
	}
	pgid := cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case err := <-waitc:
		return err
	case <-time.After(30 * time.Second):
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	return <-waitc
}
