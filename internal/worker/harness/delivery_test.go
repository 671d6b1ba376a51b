package harness

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/devupstream"
)

// TestMessageToAWarmAgentIsStoredOnce: a message to a conversation whose
// agent runs and is idle is accepted and its turn begun with one write of
// the state file, not two (each write is synced: the second cost every
// turn a millisecond or more on a busy disk). The turn runs as before.
func TestMessageToAWarmAgentIsStoredOnce(t *testing.T) {
	r := startRig(t, rigOptions{noJail: true})
	reg := prometheus.NewRegistry()
	r.h.RegisterMetrics(reg)
	saves := func() float64 { return metricValue(t, reg, "talkide_worker_state_saves_total", nil) }
	mustCreate(t, r.h, "c1")
	evs := r.follow(t, "c1")
	mustSend(t, r.h, "c1", "m1", "hello")
	waitFor(t, "first turn", 60*time.Second, func() bool { return evs.count(contract.EventTurnCompleted) == 1 })
	// The turn's last state write happens under the session's lock with
	// its turn_completed: once Status has the lock, it is done.
	if _, err := r.h.Status("c1"); err != nil {
		t.Fatal(err)
	}
	if n := r.h.LiveProcesses(); n != 1 {
		t.Fatalf("live processes after the first turn: %d, want 1 (a warm agent)", n)
	}

	// The answer waits, so nothing the turn does next is counted.
	r.upstream.Script(devupstream.Response{FirstByteDelay: 2 * time.Second, Content: []devupstream.ContentBlock{devupstream.Text("later")}})
	before := saves()
	mustSend(t, r.h, "c1", "m2", "again")
	if got := saves() - before; got != 1 {
		t.Errorf("state writes to accept a message and begin its turn: %v, want 1", got)
	}
	waitFor(t, "second turn", 60*time.Second, func() bool { return evs.count(contract.EventTurnCompleted) == 2 })
	var order []contract.EventType
	for _, ev := range evs.snapshot() {
		switch ev.Type {
		case contract.EventUserMessage, contract.EventTurnStarted, contract.EventTurnCompleted:
			order = append(order, ev.Type)
		}
	}
	want := []contract.EventType{contract.EventUserMessage, contract.EventTurnStarted, contract.EventTurnCompleted}
	want = append(want, want...)
	if len(order) != len(want) {
		t.Fatalf("events: %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("events: %v, want %v", order, want)
		}
	}
	st, err := r.h.Status("c1")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != contract.StateIdle || st.QueuedMessages != 0 {
		t.Errorf("status after both turns: %+v, want idle with nothing queued", st)
	}
}

// TestTurnStartWalksOnlyWhenTheLastWalkMayNotHold: the disk limit walked a
// conversation's directories at every turn's start, freezing its agent for
// the walk (with 200 busy conversations, walks were a sixth of the worker's
// CPU). A warm agent's next turns now start without a walk while the
// filesystem has not grown by what the conversation had left; the limits
// still hold (TestAgentDiskLimit and the tests after it).
func TestTurnStartWalksOnlyWhenTheLastWalkMayNotHold(t *testing.T) {
	r := startRig(t, rigOptions{diskLimit: 1 << 40, fileLimit: 1 << 40, diskEvery: time.Hour})
	reg := prometheus.NewRegistry()
	r.h.RegisterMetrics(reg)
	walks := func() float64 { return metricValue(t, reg, "talkide_worker_disk_walks_total", nil) }
	mustCreate(t, r.h, "c1")
	evs := r.follow(t, "c1")
	for i := 1; i <= 3; i++ {
		mustSend(t, r.h, "c1", fmt.Sprint("m", i), "hello")
		waitFor(t, "turn", 60*time.Second, func() bool { return evs.count(contract.EventTurnCompleted) == i })
	}
	if n := r.h.LiveProcesses(); n != 1 {
		t.Fatalf("live processes: %d, want 1 warm agent", n)
	}
	if got := walks(); got != 1 {
		t.Errorf("walks for three turns of one warm agent: %v, want 1 (the first turn's)", got)
	}
}
