package harness

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
// still arrives, in order, under consecutive ids. (That none is shown
// before its sync is TestWrittenEventsWaitForTheirCommit's.)
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
// under the allow policy) is stored, with what the CLI said before it,
// before the answer reaches the CLI: a crash never leaves a tool that ran
// without its call on record.
func TestAnAllowedToolRunsWithItsCallStored(t *testing.T) {
	lines := subagentLines(t)
	t.Run("call printed first", func(t *testing.T) { allowedToolsStored(t, lines) })
	t.Run("permission asked first", func(t *testing.T) { allowedToolsStored(t, askedFirst(t, lines)) })
}

func allowedToolsStored(t *testing.T, lines [][]byte) {
	s, p := lineSession(t, PolicyAllow, nil)
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	var answering string // the tool_use_id whose answer is being written
	var storedAtAnswer []bool
	p.stdin = writeWatcher{f: devNull, onWrite: func() {
		if answering == "" {
			return
		}
		evs, err := s.log.Since(0, 1000)
		if err != nil {
			t.Error(err)
		}
		stored := false
		for _, ev := range evs {
			stored = stored || ev.Type == contract.EventToolUse && strings.Contains(string(ev.Data), answering)
		}
		storedAtAnswer = append(storedAtAnswer, stored)
	}}
	kept := false
	for _, l := range lines {
		m, err := streamjson.Parse(l)
		if err != nil {
			t.Fatal(err)
		}
		c, asks := m.(*streamjson.ControlRequest)
		if asks = asks && c.Subtype() == "can_use_tool"; asks {
			var req struct {
				ToolUseID string `json:"tool_use_id"`
			}
			if err := json.Unmarshal(c.Request, &req); err != nil || req.ToolUseID == "" {
				t.Fatalf("can_use_tool without a tool_use_id: %s", c.Request)
			}
			answering = req.ToolUseID
		}
		s.handle(p, m, true) // the next line always at hand
		answering = ""
		if asks {
			if n := s.log.Pending(); n != 0 {
				t.Errorf("after letting a tool run: %d events not stored", n)
			}
		} else if s.log.Pending() > 0 {
			kept = true
		}
	}
	if len(storedAtAnswer) == 0 || !kept {
		t.Fatalf("the lines let %d tools run and kept events %v: the test sees nothing", len(storedAtAnswer), kept)
	}
	for i, stored := range storedAtAnswer {
		if !stored {
			t.Errorf("answer %d reached the CLI before its tool_use was stored", i)
		}
	}
}

// writeWatcher is a CLI stdin (a syscall.RawConn) that calls onWrite
// before each write, and writes to f.
type writeWatcher struct {
	f       *os.File
	onWrite func()
}

func (w writeWatcher) Control(fn func(fd uintptr)) error { fn(w.f.Fd()); return nil }
func (w writeWatcher) Read(fn func(fd uintptr) bool) error {
	fn(w.f.Fd())
	return nil
}
func (w writeWatcher) Write(fn func(fd uintptr) bool) error {
	w.onWrite()
	fn(w.f.Fd())
	return nil
}
