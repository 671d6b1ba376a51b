package chaos

import (
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// supervised is a process started again whenever it exits, until it is
// stopped, as a pod's container is: the worker, a control-plane replica.
type supervised struct {
	t    *testing.T
	what string
	bin  string
	env  []string
	log  *os.File
	// started and ended, when set, are called as each process starts
	// (with the channel closed when it exits) and once it has exited,
	// before that channel is closed (a replica in and out of rotation).
	started func(exited <-chan struct{})
	ended   func()

	stopping atomic.Bool
	done     chan struct{}

	mu     sync.Mutex
	cmd    *exec.Cmd     // the current process; guarded by mu
	exited chan struct{} // closed when cmd exited; guarded by mu
}

// supervise starts s's process now and keeps it running until stop.
func supervise(s *supervised) *supervised {
	s.done = make(chan struct{})
	go s.run()
	return s
}

func (s *supervised) run() {
	defer close(s.done)
	for !s.stopping.Load() {
		cmd := exec.Command(s.bin)
		cmd.Env = s.env
		cmd.Stdout, cmd.Stderr = s.log, s.log
		exited := make(chan struct{})
		if err := cmd.Start(); err != nil {
			s.t.Errorf("start %s: %v", s.what, err)
			return
		}
		s.mu.Lock()
		s.cmd, s.exited = cmd, exited
		s.mu.Unlock()
		if s.started != nil {
			s.started(exited)
		}
		cmd.Wait()
		if s.ended != nil {
			s.ended()
		}
		close(exited)
	}
}

// running reports whether a process was started.
func (s *supervised) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// signal sends sig to the current process and returns the channel closed
// when it has exited (the supervisor then starts the next).
func (s *supervised) signal(sig syscall.Signal) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
	return s.exited
}

// stop ends the supervision: the process gets SIGTERM and is not started
// again; it returns once it has exited. Stopping again does nothing.
func (s *supervised) stop() {
	s.stopping.Store(true)
	s.signal(syscall.SIGTERM)
	<-s.done
}
