package harness

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/streamjson"
)

// buildStandin builds bench-worker's stand-in CLI, which answers the
// stream-json protocol without a model and can write a turn's lines at
// once (scripts/bench-worker/standin).
func buildStandin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "standin")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/talkide/talkide/scripts/bench-worker/standin").CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in CLI: %v\n%s", err, out)
	}
	return bin
}

// TestLinesWrittenTogetherShareASync: when the agent's lines pile up in
// its pipe (here 40 assistant lines and the result in one write), the
// worker stores them with a few syncs, not one each, and every event
// still arrives, in order, under consecutive ids, each published only once
// stored. A line alone is still synced before the worker waits for the
// next (the turn's first line, system/init, is written alone).
func TestLinesWrittenTogetherShareASync(t *testing.T) {
	r := startRig(t, rigOptions{noJail: true, claudeBin: buildStandin(t)})
	reg := prometheus.NewRegistry()
	r.h.RegisterMetrics(reg)
	syncs := func() float64 { return metricValue(t, reg, "talkide_worker_event_syncs_total", nil) }
	mustCreate(t, r.h, "c1")
	evs := r.follow(t, "c1")
	mustSend(t, r.h, "c1", "m1", "bench lines=1")
	waitFor(t, "warm-up turn", 60*time.Second, func() bool { return evs.count(contract.EventTurnCompleted) == 1 })
	if _, err := r.h.Status("c1"); err != nil { // the turn's last sync is done under the lock
		t.Fatal(err)
	}

	const lines = 40
	before, seen := syncs(), len(evs.snapshot())
	mustSend(t, r.h, "c1", "m2", "bench lines=40 burst=1")
	waitFor(t, "burst turn", 60*time.Second, func() bool { return evs.count(contract.EventTurnCompleted) == 2 })
	if _, err := r.h.Status("c1"); err != nil {
		t.Fatal(err)
	}
	got := evs.snapshot()
	texts := 0
	for i, ev := range got {
		if i > 0 && ev.ID != got[i-1].ID+1 {
			t.Fatalf("event %d has id %d after %d: ids must be consecutive", i, ev.ID, got[i-1].ID)
		}
		if i >= seen && ev.Type == contract.EventAssistantText {
			texts++
		}
	}
	if texts != lines {
		t.Fatalf("assistant texts of the burst: %d, want %d", texts, lines)
	}
	stored := len(got) - seen
	n := syncs() - before
	t.Logf("burst turn: %d events stored with %v syncs", stored, n)
	// Without group commit every line is a sync: at least 41 here.
	if n > 10 {
		t.Errorf("syncs for a turn of %d events whose %d lines came at once: %v, want at most 10", stored, lines+1, n)
	}
	if last, err := r.h.Status("c1"); err != nil || last.LastEventID != got[len(got)-1].ID {
		t.Errorf("status says last event %d (%v), the stream %d", last.LastEventID, err, got[len(got)-1].ID)
	}
}

// TestKeptEventsAreStoredOnlyWhileOwned: events the stdout reader kept for
// its next sync are stored when the session unloads while it owns the
// conversation, and never written when it lost it (another replica may be
// writing the log by then).
func TestKeptEventsAreStoredOnlyWhileOwned(t *testing.T) {
	r := startRig(t, rigOptions{noJail: true})
	for _, tc := range []struct {
		conv  string
		owned bool
	}{{"kept-owned", true}, {"kept-lost", false}} {
		mustCreate(t, r.h, tc.conv)
		r.follow(t, tc.conv) // loads it
		var s *session
		waitFor(t, "the session loaded", 10*time.Second, func() bool {
			r.h.mu.Lock()
			defer r.h.mu.Unlock()
			s = r.h.sessions[tc.conv]
			return s != nil && s.held != nil
		})
		s.mu.Lock()
		s.deferSync = true // as the reader does with the next line at hand
		s.emitLocked(contract.EventAssistantText, contract.AssistantText{Text: "kept for the next sync"})
		s.deferSync = false
		pending := s.log.Pending()
		s.mu.Unlock()
		if pending != 1 {
			t.Fatalf("%s: %d events kept, want 1", tc.conv, pending)
		}
		if !tc.owned {
			if err := s.held.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		s.lose()
		l, err := r.h.store.OpenEventLogReader(tc.conv)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := l.Since(0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		stored := false
		for _, ev := range evs {
			stored = stored || ev.Type == contract.EventAssistantText
		}
		if stored != tc.owned {
			t.Errorf("%s: the kept event stored: %v, want %v", tc.conv, stored, tc.owned)
		}
	}
}

// TestAnAllowedToolRunsWithItsCallStored: while the reader keeps events
// for a later sync, a tool call it lets run (the answer to can_use_tool
// under the allow policy) first stores what the CLI said before, and its
// tool_use is stored at once: a crash never leaves a tool that ran
// without its call on record longer than a sync.
func TestAnAllowedToolRunsWithItsCallStored(t *testing.T) {
	s, p := lineSession(t, PolicyAllow, nil)
	log := s.log
	kept, answers := false, 0
	for _, l := range subagentLines(t) {
		m, err := streamjson.Parse(l)
		if err != nil {
			t.Fatal(err)
		}
		s.handle(p, m, true) // the next line always at hand
		if c, ok := m.(*streamjson.ControlRequest); ok && c.Subtype() == "can_use_tool" {
			answers++
			if n := log.Pending(); n != 0 {
				t.Errorf("after letting a tool run: %d events not stored", n)
			}
		} else if log.Pending() > 0 {
			kept = true
		}
	}
	if answers == 0 || !kept {
		t.Fatalf("the lines let %d tools run and kept events %v: the test sees nothing", answers, kept)
	}
}
