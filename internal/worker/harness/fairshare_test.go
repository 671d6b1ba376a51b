package harness

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// createAs and sendAs are mustCreate and mustSend for another user than u1.
func createAs(t *testing.T, h *Harness, user, conv string) {
	t.Helper()
	if _, err := h.CreateSession(conv, contract.CreateSessionRequest{UserID: user}); err != nil {
		t.Fatalf("create %s for %s: %v", conv, user, err)
	}
}

func sendAs(t *testing.T, h *Harness, user, conv, id, text string) {
	t.Helper()
	if _, err := h.SendMessage(conv, contract.SendMessageRequest{ClientMessageID: id, UserID: user, Text: text}); err != nil {
		t.Fatalf("send %s to %s as %s: %v", id, conv, user, err)
	}
}

// turnEnded reports whether e holds the end of a turn.
func turnEnded(e *events) bool {
	return e.count(contract.EventTurnCompleted)+e.count(contract.EventTurnFailed) > 0
}

// TestOneUsersLongTurnsDoNotMakeAnotherWait guards against issue 26's "no
// fair share": on a worker capped at three CLI processes, user a starts
// three turns that run a minute-long command; a's third waits (a holds the
// most one user may, two), and user b's turn, sent after, starts at once
// and ends while a's first two still run. When a's first turn ends, its
// idle process is the one stopped to make room for a's third (not b's idle
// one, whose stopping would not let a's turn run).
func TestOneUsersLongTurnsDoNotMakeAnotherWait(t *testing.T) {
	r := startRig(t, rigOptions{maxProcesses: 3})
	a := []string{"a1", "a2", "a3"}
	logs := map[string]*events{}
	t0 := time.Now()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, c := range []string{"a1", "a2", "a3", "b1"} {
			for _, ev := range logs[c].snapshot() {
				t.Logf("%s: %s %s %.300s", c, ev.Time.Sub(t0), ev.Type, ev.Data)
			}
		}
	})
	for _, c := range a {
		createAs(t, r.h, "alice", c)
		logs[c] = r.follow(t, c)
	}
	createAs(t, r.h, "bob", "b1")
	logs["b1"] = r.follow(t, "b1")
	for _, c := range a {
		sendAs(t, r.h, "alice", c, "m1", "please run `echo long-"+c+"; sleep 60; echo slept-"+c+"`")
	}
	sendAs(t, r.h, "bob", "b1", "m1", "please run `echo bob-ran`")
	waitEvent(t, logs["b1"], contract.EventTurnCompleted, 0, 90*time.Second)
	for _, c := range []string{"a1", "a2"} {
		if turnEnded(logs[c]) {
			t.Errorf("%s's minute-long turn ended before bob's: bob waited for alice's turns", c)
		}
	}
	if n := logs["b1"].count(contract.EventTurnQueued); n != 0 {
		t.Errorf("bob's turn queued %d times, want it to start at once", n)
	}
	if n := logs["a3"].count(contract.EventTurnStarted); n != 0 {
		t.Errorf("a's third turn started while a held two processes (its cap)")
	}
	var queued []contract.TurnQueued
	for _, ev := range logs["a3"].snapshot() {
		if ev.Type == contract.EventTurnQueued {
			queued = append(queued, payload[contract.TurnQueued](t, ev))
		}
	}
	want := []contract.TurnQueued{{ClientMessageID: "m1", Position: 1, LiveProcesses: 2, MaxProcesses: 3}}
	if diff := cmp.Diff(want, queued); diff != "" {
		t.Fatalf("a's third turn_queued (-want +got):\n%s", diff)
	}

	// a's first turn ends: its idle process makes room for a's third.
	if ok, err := r.h.Interrupt("a1"); err != nil || !ok {
		t.Fatalf("interrupt a1: %v, %v", ok, err)
	}
	waitEvent(t, logs["a3"], contract.EventTurnStarted, 0, 60*time.Second)
	if turnEnded(logs["a2"]) {
		t.Error("a2's turn ended before a3 started: a3 waited for it")
	}
	for _, ev := range logs["b1"].snapshot() {
		if ev.Type == contract.EventSessionStopped {
			t.Errorf("bob's idle process was stopped (%s); stopping it lets none of alice's turns run", ev.Data)
		}
	}
	if ev, _ := waitEvent(t, logs["a1"], contract.EventSessionStopped, 0, 30*time.Second); !strings.Contains(string(ev.Data), `"evicted"`) && !strings.Contains(string(ev.Data), `"interrupt_timeout"`) {
		t.Errorf("a1's process stopped with %s, want evicted", ev.Data)
	}
}

// testSession is a session of user for the slots alone (no process, no
// harness).
func testSession(user string) *session {
	return &session{conv: user, meta: &sessionstore.Meta{UserID: user}}
}

// TestSlotsOrder drives slots by hand: the per-user cap, the order freed
// slots are handed out and the positions told, and that every slot comes
// back.
func TestSlotsOrder(t *testing.T) {
	sl := &slots{max: 4, perUser: 3}
	a1, a2, a3, a4, a5 := testSession("a"), testSession("a"), testSession("a"), testSession("a"), testSession("a")
	b1, b2, c1 := testSession("b"), testSession("b"), testSession("c")
	names := map[*session]string{a1: "a1", a2: "a2", a3: "a3", a4: "a4", a5: "a5", b1: "b1", b2: "b2", c1: "c1"}
	acquire := func(s *session, want bool) {
		t.Helper()
		if got := sl.acquire(s); got != want {
			t.Fatalf("acquire %s: got %v, want %v", names[s], got, want)
		}
	}
	put := func(s *session, want ...*session) {
		t.Helper()
		var got []string
		for _, w := range sl.put(s) {
			got = append(got, names[w.s])
			if !sl.claim(w.s) {
				t.Fatalf("claim %s: the slot handed to it is not there", names[w.s])
			}
		}
		var wantNames []string
		for _, w := range want {
			wantNames = append(wantNames, names[w])
		}
		if diff := cmp.Diff(wantNames, got); diff != "" {
			t.Fatalf("put %s: handed to (-want +got):\n%s", names[s], diff)
		}
	}
	positions := func(want map[string]int) {
		t.Helper()
		got := map[string]int{}
		for _, s := range []*session{a1, a2, a3, a4, a5, b1, b2, c1} {
			if _, _, pos := sl.status(s); pos > 0 {
				got[names[s]] = pos
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("positions (-want +got):\n%s", diff)
		}
	}

	acquire(a1, true)
	acquire(a2, true)
	acquire(a3, true)
	acquire(a4, false) // a holds three, its cap, although a slot is free
	acquire(a4, false) // waits once
	acquire(b1, true)  // the free slot is b's: a newcomer of another user
	acquire(b2, false)
	acquire(c1, false)
	acquire(a5, false)
	// c holds none, b one, a three: c first, then b, then a's in order of
	// arrival.
	positions(map[string]int{"c1": 1, "b2": 2, "a4": 3, "a5": 4})
	if live, max, _ := sl.status(a1); live != 4 || max != 4 {
		t.Fatalf("live %d of %d, want 4 of 4", live, max)
	}

	put(b1, b2) // b and c both hold none now: b2 came first
	positions(map[string]int{"c1": 1, "a4": 2, "a5": 3})
	put(a1, c1) // a holds two, c none
	put(a2, a4) // only a waits; a holds one
	positions(map[string]int{"a5": 1})
	put(b2, a5) // a holds two (a3, a4): a5 is its third
	positions(map[string]int{})

	// A waiter that goes away leaves nothing behind; a slot handed to a
	// session that took it itself (acquire) is not taken twice.
	acquire(b1, false)
	sl.dequeue(b1)
	positions(map[string]int{})
	c2 := testSession("c")
	names[c2] = "c2"
	acquire(c2, false)
	got := sl.put(a3)
	if len(got) != 1 || got[0].s != c2 {
		t.Fatalf("put a3: handed to %v, want c2", got)
	}
	acquire(c2, true) // c2 pumps before the hand-over runs: it takes the slot
	if sl.claim(c2) {
		t.Fatal("the slot c2 took itself was handed over again")
	}
	put(b1) // never held one: nothing changes
	for _, s := range []*session{a4, a5, c1, c2} {
		put(s)
	}
	if sl.live != 0 || len(sl.held) != 0 || len(sl.holders) != 0 || len(sl.waiting) != 0 {
		t.Fatalf("after every slot came back: live %d, held %v, holders %d, waiting %d; want none", sl.live, sl.held, len(sl.holders), len(sl.waiting))
	}
}

// TestSlotsSameStandingFIFO: waiters of users holding as many slots are
// served in order of arrival, and a newcomer of the same standing queues
// behind them.
func TestSlotsSameStandingFIFO(t *testing.T) {
	sl := &slots{max: 2, perUser: 1}
	a, b := testSession("a"), testSession("b")
	x, y, z := testSession("x"), testSession("y"), testSession("z")
	for _, s := range []*session{a, b} {
		if !sl.acquire(s) {
			t.Fatalf("acquire %s: refused with a free slot", s.conv)
		}
	}
	for _, s := range []*session{x, y} {
		if sl.acquire(s) {
			t.Fatalf("acquire %s: got a slot, want none free", s.conv)
		}
	}
	order := func() []string {
		var out []string
		for _, s := range []*session{x, y, z} {
			if _, _, pos := sl.status(s); pos > 0 {
				for len(out) < pos {
					out = append(out, "")
				}
				out[pos-1] = s.conv
			}
		}
		return out
	}
	if diff := cmp.Diff([]string{"x", "y"}, order()); diff != "" {
		t.Fatalf("order (-want +got):\n%s", diff)
	}
	if got := sl.put(a); len(got) != 1 || got[0].s != x {
		t.Fatalf("put a: handed to %v, want x", got)
	}
	if sl.acquire(z) {
		t.Fatal("z took a slot ahead of y")
	}
	if diff := cmp.Diff([]string{"y", "z"}, order()); diff != "" {
		t.Fatalf("order (-want +got):\n%s", diff)
	}
	if got := sl.put(b); len(got) != 1 || got[0].s != y {
		t.Fatalf("put b: handed to %v, want y", got)
	}
}

// TestEvictionHelpsOnlyWhereASlotWouldServe: an idle process is worth
// stopping only when its slot would go to a waiter.
func TestEvictionHelpsOnlyWhereASlotWouldServe(t *testing.T) {
	sl := &slots{max: 3, perUser: 2}
	a1, a2, a3, b1 := testSession("a"), testSession("a"), testSession("a"), testSession("b")
	for _, s := range []*session{a1, a2, b1} {
		if !sl.acquire(s) {
			t.Fatalf("acquire %s: refused", s.conv)
		}
	}
	if sl.acquire(a3) {
		t.Fatal("a3 got a slot beyond a's cap")
	}
	if helps, held := sl.eviction(b1); helps || held != 1 {
		t.Errorf("eviction of b's: got helps %v held %d, want false 1 (a stays at its cap)", helps, held)
	}
	if helps, held := sl.eviction(a1); !helps || held != 2 {
		t.Errorf("eviction of a's: got helps %v held %d, want true 2", helps, held)
	}
	if sl.held["a"] != 2 || sl.live != 3 {
		t.Errorf("eviction changed the counts: held a %d, live %d", sl.held["a"], sl.live)
	}
}

func TestMaxProcessesPerUserDefaults(t *testing.T) {
	for _, tc := range []struct {
		max, perUser, want int
		wantErr            bool
	}{
		{0, 0, 3, false},
		{1, 0, 1, false},
		{2, 0, 1, false},
		{3, 3, 3, false},
		{3, 4, 0, true},
		{3, -1, 0, true},
	} {
		dir := t.TempDir()
		c := Config{ClaudeBin: "claude", ConfigDir: dir + "/c", WorkspaceRoot: dir + "/w", HomeDir: dir + "/h", TmpRoot: dir + "/t",
			MaxProcesses: tc.max, MaxProcessesPerUser: tc.perUser}
		err := c.setDefaults()
		if (err != nil) != tc.wantErr {
			t.Errorf("max %d per user %d: got error %v, want error %v", tc.max, tc.perUser, err, tc.wantErr)
			continue
		}
		if err == nil && c.MaxProcessesPerUser != tc.want {
			t.Errorf("max %d per user %d: got %d, want %d", tc.max, tc.perUser, c.MaxProcessesPerUser, tc.want)
		}
	}
}
