package platformtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Process is a platform binary running as a child process of a test, with
// its JSON log (stderr) kept.
type Process struct {
	Cmd *exec.Cmd
	// URL is http://<addr>, from the log line that said it listens.
	URL string
	// Exited is closed when the process has ended; Err is then Wait's
	// result.
	Exited chan struct{}
	Err    error

	mu sync.Mutex
	// log is the process's stderr so far; guarded by mu.
	log bytes.Buffer
}

// Log returns what the process wrote to stderr so far.
func (p *Process) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// StartProcess starts cmd and waits (at most guard) for its JSON log line
// {"msg": listening, "addr": …}; the test fails if the process exits first
// or never says so. At cleanup a process still running gets stop, then
// SIGKILL after guard; a failed test logs the last 60 lines of its log.
func StartProcess(t testing.TB, cmd *exec.Cmd, listening string, stop os.Signal, guard time.Duration) *Process {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	p := &Process{Cmd: cmd, Exited: make(chan struct{})}
	addrs := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			p.mu.Lock()
			p.log.Write(line)
			p.log.WriteByte('\n')
			p.mu.Unlock()
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(line, &rec) == nil && rec.Msg == listening {
				select {
				case addrs <- rec.Addr:
				default:
				}
			}
		}
		p.Err = cmd.Wait()
		close(p.Exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.Exited:
		default:
			cmd.Process.Signal(stop)
			select {
			case <-p.Exited:
			case <-time.After(guard):
				cmd.Process.Kill()
				<-p.Exited
			}
		}
		if t.Failed() {
			lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
			t.Logf("%s log (tail):\n%s", listening, strings.Join(lines[max(len(lines)-60, 0):], "\n"))
		}
	})
	select {
	case addr := <-addrs:
		p.URL = "http://" + addr
	case <-p.Exited:
		t.Fatalf("process exited while starting: %v\n%s", p.Err, p.Log())
	case <-time.After(guard):
		t.Fatalf("process did not say %q within %s\n%s", listening, guard, p.Log())
	}
	return p
}
