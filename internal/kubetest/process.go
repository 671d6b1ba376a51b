package kubetest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// proc is one component of the cluster, running in its own process group
// with its output in <dir>/<name>.log.
type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	// done is closed when the process has exited; err is its exit status.
	done chan struct{}
	err  error
}

func startProc(dir, name, bin string, args ...string) (*proc, error) {
	return startProcEnv(dir, name, bin, nil, args...)
}

// startProcEnv is startProc with env added to the test's environment.
func startProcEnv(dir, name, bin string, env []string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group, so Stop reaches everything it forks; and
	// SIGKILL when the process that started it dies, so a crashed test
	// binary leaves no orphans.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited returns an error naming the process and the end of its log when
// it has exited, nil while it runs.
func (p *proc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); end of %s:\n%s", p.name, p.err, p.log, p.logTail(30))
	default:
		return nil
	}
}

func (p *proc) logTail(n int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	return tail(string(b), n)
}

// stop sends SIGTERM to the process group, and SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	// Also after a clean exit: a child left in the group goes too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
}

// freePorts returns n distinct free TCP ports on 127.0.0.1, holding them
// all open until each is known, so no two are the same.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func itoa(n int) string { return strconv.Itoa(n) }
