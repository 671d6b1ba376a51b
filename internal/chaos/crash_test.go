package chaos

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/testlane"
)

// TestWorkerCrashEndsDetachedAgents is case C1 for a crash of the worker
// itself: an agent detaches processes (own session, cleared environment,
// nohup, double fork), the worker process is SIGKILLed, and every one of
// them ends with it: the jail's init dies with its parent (bwrap's
// --die-with-parent), which ends the agent's PID namespace. The restarted
// worker serves the conversation again.
func TestWorkerCrashEndsDetachedAgents(t *testing.T) {
	p := start(t)
	defer p.stop()
	var c struct{ ID string }
	if st, err := p.call("POST", "/api/conversations", map[string]string{"tenant": "demo", "env": "dev"}, &c); err != nil || st != 201 {
		t.Fatalf("create conversation: %d %v", st, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := p.watch(ctx, c.ID)
	cmd := "setsid sleep 873711 >/dev/null 2>&1 & setsid env -i sleep 873712 >/dev/null 2>&1 & " +
		"nohup sleep 873713 >/dev/null 2>&1 & (sh -c 'sleep 873714 >/dev/null 2>&1 &' &); echo detached"
	if err := p.send(c.ID, "m1", "please run `"+cmd+"`"); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.TurnEnd("m1", 120*time.Second); !ok {
		t.Fatal("first turn never ended")
	}
	// The double fork's sleep may start just after the turn ends.
	for deadline := time.Now().Add(2 * time.Minute); len(platformtest.HostProcesses("sleep 87371")) != 4; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("detached processes running: %v, want 4", platformtest.HostProcesses("sleep 87371"))
		}
	}
	p.kill()
	deadline := time.Now().Add(2 * time.Minute)
	for len(platformtest.HostProcesses("sleep 87371")) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("processes outlived the crashed worker: %v", platformtest.HostProcesses("sleep 87371"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.waitReady()
	if err := p.send(c.ID, "m2", "please run `echo after-crash`"); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.TurnEnd("m2", 120*time.Second); !ok {
		t.Fatal("the turn after the crash never ended")
	}
}

// TestPlatformLeavesNoWorkerBehind: a test that never stops its platform
// (TestRollingRestartOfControlPlanesFailsNoTurn did not) leaves no worker
// process running once it has ended; one was found running half an hour
// after a full make test.
func TestPlatformLeavesNoWorkerBehind(t *testing.T) {
	testlane.NeedsCLI(t)
	var pid int
	t.Run("platform", func(t *testing.T) {
		p := start(t)
		p.worker.mu.Lock()
		pid = p.worker.cmd.Process.Pid
		p.worker.mu.Unlock()
	})
	if pid == 0 {
		t.Fatal("the worker never started")
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("the worker (pid %d) still runs after its test ended (kill -0: %v)", pid, err)
	}
}
