package harness

import (
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/sandbox"
)

// limitEvent waits for a limit_reached event of limit in e.
func limitEvent(t *testing.T, e *events, limit string, timeout time.Duration) contract.LimitReached {
	t.Helper()
	var got contract.LimitReached
	waitFor(t, "limit_reached "+limit, timeout, func() bool {
		for _, ev := range e.snapshot() {
			if ev.Type == contract.EventLimitReached {
				if l := payload[contract.LimitReached](t, ev); l.Limit == limit {
					got = l
					return true
				}
			}
		}
		return false
	})
	return got
}

// TestAgentLimits is case C6's limits: a bounded memory hog and a bounded
// process loop run by one conversation's agent hit that conversation's
// limits; each becomes a limit_reached event, and the worker, the same
// conversation's next turn and another conversation's turn all go on.
func TestAgentLimits(t *testing.T) {
	r := startRig(t, rigOptions{limits: sandbox.Limits{MemoryBytes: 1 << 30, Processes: 160}})
	mustCreate(t, r.h, "hog")
	mustCreate(t, r.h, "other")
	e := r.follow(t, "hog")
	o := r.follow(t, "other")

	// 1.5 GB held by tail (no newline in its input) against a 1 GiB limit.
	mustSend(t, r.h, "hog", "m1", "please run `head -c 1500000000 /dev/zero | tail > /dev/null; echo hog-exit=$?`")
	mem := limitEvent(t, e, contract.LimitMemory, 3*time.Minute)
	if mem.Max != 1<<30 || mem.Used < 1 || !strings.Contains(mem.Message, "memory limit") {
		t.Errorf("memory limit event: %+v", mem)
	}
	waitEvent(t, e, contract.EventTurnCompleted, 0, 3*time.Minute)

	// 400 short-lived processes against a limit of 160 (the CLI's threads
	// count too); the loop's shell dies when a fork is refused.
	mustSend(t, r.h, "hog", "m2", "please run `sh -c 'i=0; while [ $i -lt 400 ]; do sleep 4 & i=$((i+1)); done' 2>/dev/null; echo loop-exit=$?`")
	_, i := waitEvent(t, e, contract.EventTurnCompleted, 0, 3*time.Minute)
	_, i = waitEvent(t, e, contract.EventTurnCompleted, i+1, 3*time.Minute)
	if testing.Verbose() {
		for _, ev := range e.snapshot() {
			t.Logf("%s %s", ev.Type, ev.Data)
		}
	}
	procs := limitEvent(t, e, contract.LimitProcesses, 2*time.Minute)
	if procs.Max != 160 || !strings.Contains(procs.Message, "160 processes") {
		t.Errorf("process limit event: %+v", procs)
	}

	// Survivors: another conversation, and this one's next turn.
	mustSend(t, r.h, "other", "m1", "please run `echo other-alive`")
	if tr, _ := waitEvent(t, o, contract.EventToolResult, 0, 3*time.Minute); !strings.Contains(payload[contract.ToolResult](t, tr).Content, "other-alive") {
		t.Errorf("the other conversation's command: %s", tr.Data)
	}
	time.Sleep(4500 * time.Millisecond) // the loop's sleeps end; not an assertion on time
	from := len(e.snapshot())
	mustSend(t, r.h, "hog", "m3", "please run `echo hog-alive`")
	waitEvent(t, e, contract.EventTurnCompleted, from, 3*time.Minute)
	var alive bool
	for _, ev := range e.snapshot()[from:] {
		alive = alive || ev.Type == contract.EventToolResult && strings.Contains(string(ev.Data), "hog-alive")
	}
	if !alive {
		t.Errorf("the conversation's next turn did not run its command: %v", e.snapshot()[from:])
	}
}

// TestAgentDiskLimit: a conversation whose files grow past its disk limit
// gets a limit_reached event and its turn is stopped; one file can never
// grow past the limit at all (RLIMIT_FSIZE).
func TestAgentDiskLimit(t *testing.T) {
	r := startRig(t, rigOptions{diskLimit: 48 << 20})
	mustCreate(t, r.h, "disk")
	e := r.follow(t, "disk")
	mustSend(t, r.h, "disk", "m1", "please run `head -c 100000000 /dev/zero > big; ls -l big; head -c 30000000 /dev/zero > a; head -c 30000000 /dev/zero > b; sleep 60; echo not-stopped`")
	l := limitEvent(t, e, contract.LimitDisk, 3*time.Minute)
	if l.Max != 48<<20 || l.Used <= 48<<20 {
		t.Errorf("disk limit event: %+v", l)
	}
	end, _ := waitEvent(t, e, contract.EventTurnFailed, 0, 3*time.Minute)
	if f := payload[contract.TurnFailed](t, end); f.ClientMessageID != "m1" {
		t.Errorf("turn_failed: %+v", f)
	}
	for _, ev := range e.snapshot() {
		if ev.Type == contract.EventToolResult && strings.Contains(string(ev.Data), "not-stopped") {
			t.Error("the turn went on past the disk limit")
		}
		if ev.Type == contract.EventToolResult && strings.Contains(string(ev.Data), " 100000000 ") {
			t.Error("one file grew past the disk limit")
		}
	}
}

// TestAgentDiskLimitCountsDeletedOpenFiles: files the agent deleted but
// keeps open still take disk space, and count.
func TestAgentDiskLimitCountsDeletedOpenFiles(t *testing.T) {
	r := startRig(t, rigOptions{diskLimit: 48 << 20})
	mustCreate(t, r.h, "held")
	e := r.follow(t, "held")
	mustSend(t, r.h, "held", "m1", "please run `sh -c 'exec 3>a 4>b; head -c 30000000 /dev/zero >&3; head -c 30000000 /dev/zero >&4; rm a b; sleep 60'; echo not-stopped`")
	l := limitEvent(t, e, contract.LimitDisk, 3*time.Minute)
	if l.Used <= 48<<20 {
		t.Errorf("disk limit event: %+v", l)
	}
	waitEvent(t, e, contract.EventTurnFailed, 0, 3*time.Minute)
	for _, ev := range e.snapshot() {
		if ev.Type == contract.EventToolResult && strings.Contains(string(ev.Data), "not-stopped") {
			t.Error("the turn went on past the disk limit")
		}
	}
}

// TestAgentMemoryLimitWithoutCgroups: where agents have no control group
// (a pod whose cgroup is read-only), an agent holding more than its memory
// limit is found by sampling and its turn stopped, with a limit_reached
// event; another conversation goes on. (The kernel's OOM killer would end
// the largest process of the whole worker, whichever conversation's.)
func TestAgentMemoryLimitWithoutCgroups(t *testing.T) {
	r := startRig(t, rigOptions{noCgroups: true, limits: sandbox.Limits{MemoryBytes: 400 << 20}})
	mustCreate(t, r.h, "hog")
	mustCreate(t, r.h, "other")
	e := r.follow(t, "hog")
	o := r.follow(t, "other")
	// 900 MB held by tail (no newline in its input), and a minute's sleep
	// that must not be reached.
	mustSend(t, r.h, "hog", "m1", "please run `head -c 900000000 /dev/zero | tail > /dev/null; sleep 60; echo not-stopped`")
	mem := limitEvent(t, e, contract.LimitMemory, 3*time.Minute)
	if mem.Max != 400<<20 || mem.Used <= 400<<20 || !strings.Contains(mem.Message, "memory limit") {
		t.Errorf("memory limit event: %+v", mem)
	}
	waitEvent(t, e, contract.EventTurnFailed, 0, 3*time.Minute)
	for _, ev := range e.snapshot() {
		if ev.Type == contract.EventToolResult && strings.Contains(string(ev.Data), "not-stopped") {
			t.Error("the turn went on past the memory limit")
		}
	}
	mustSend(t, r.h, "other", "m1", "please run `echo other-alive`")
	if tr, _ := waitEvent(t, o, contract.EventToolResult, 0, 3*time.Minute); !strings.Contains(payload[contract.ToolResult](t, tr).Content, "other-alive") {
		t.Errorf("the other conversation's command: %s", tr.Data)
	}
}
