package buildmcp

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/buildjob"
	"github.com/talkide/talkide/internal/worker/mcphost"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// hookJobs is a JobReconciler whose Reconcile runs a hook first (what
// happens between ListBuilds and the Jobs list), then asks expected about
// the given Jobs, as buildjob.Dispatcher.Reconcile does.
type hookJobs struct {
	hook    func()
	jobs    []buildjob.Existing
	deleted []string
}

func (j *hookJobs) Reconcile(ctx context.Context, expected func(conversation, build string) bool) ([]buildjob.Existing, error) {
	if j.hook != nil {
		j.hook()
	}
	var keep []buildjob.Existing
	for _, e := range j.jobs {
		if expected(e.Conversation, e.Build) {
			keep = append(keep, e)
		} else {
			j.deleted = append(j.deleted, e.Build)
		}
	}
	return keep, nil
}

// TestRecoverKeepsTheJobOfABuildStartedDuringThePass: a tool call that records its
// build and creates its Job after the pass's ListBuilds but before its
// Jobs list keeps its Job (found by the review of issue 14: it was deleted as an orphan).
func TestRecoverKeepsTheJobOfABuildStartedDuringThePass(t *testing.T) {
	started := make(chan struct{})
	r := &fakeRunner{run: func(ctx context.Context, req buildjob.Request, spec buildjob.Spec, h buildjob.Hooks) (buildjob.Report, error) {
		close(started) // the Job exists now
		<-ctx.Done()
		return buildjob.Report{Outcome: buildjob.Outcome{Phase: buildjob.PhaseCancelled}, ExitCode: -1}, nil
	}}
	srv, _ := newServer(t, r)
	var ev events
	h, _ := srv.Open(Conversation{ID: "c1", UID: 20001, Emit: ev.emit})
	defer h.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	jobs := &hookJobs{jobs: []buildjob.Existing{{Conversation: "c1", Build: "toolu_new"}}}
	jobs.hook = func() {
		go callQuiet(ctx, h, "toolu_new")
		<-started
	}
	if err := srv.Recover(t.Context(), func(string, contract.EventType, any) error { return nil }, jobs); err != nil {
		t.Fatal(err)
	}
	t.Logf("Jobs the pass deleted: %v (the build toolu_new is live and recorded)", jobs.deleted)
	if len(jobs.deleted) != 0 {
		t.Errorf("the recovery pass deleted the Job of a live, recorded build")
	}
}

// TestRecoverDeliversABuildEndingDuringThePassOnce: a build that ends
// between the pass's ListBuilds and its live check gets one
// build_completed (the review of issue 14 saw a second: the local
// runner's WorkerRestarted failure after the real success).
func TestRecoverDeliversABuildEndingDuringThePassOnce(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{})
	r := &fakeRunner{run: func(ctx context.Context, req buildjob.Request, spec buildjob.Spec, h buildjob.Hooks) (buildjob.Report, error) {
		close(started)
		<-release
		return buildjob.Report{Runner: "local", Outcome: buildjob.Outcome{Phase: buildjob.PhaseSucceeded}, ExitCode: 0}, nil
	}}
	srv, store := newServer(t, r)
	var ev events
	h, _ := srv.Open(Conversation{ID: "c1", UID: 20001, Emit: ev.emit})
	defer h.Close()
	done := make(chan struct{})
	go func() { defer close(done); callQuiet(t.Context(), h, "toolu_b") }()
	<-started
	// The pass: its ListBuilds sees the record; the build ends; then the
	// pass looks at the record (Records wrapper runs the hook after listing).
	srv.cfg.Records = &hookRecords{Records: store, after: func() { close(release); <-done }}
	deliver := func(conv string, typ contract.EventType, p any) error { ev.emit(typ, p); return nil }
	if err := srv.Recover(t.Context(), deliver, nil); err != nil {
		t.Fatal(err)
	}
	for _, e := range ev.ofType(contract.EventBuildCompleted) {
		var c contract.BuildCompleted
		_ = json.Unmarshal(e.Data, &c)
		t.Logf("build_completed %s: %s %s recovered=%v", c.BuildID, c.Phase, c.Reason, c.Recovered)
	}
	if n := len(ev.ofType(contract.EventBuildCompleted)); n != 1 {
		t.Errorf("%d build_completed events for one build, want 1", n)
	}
}

type hookRecords struct {
	Records
	after func()
}

func (r *hookRecords) ListBuilds() ([]sessionstore.BuildRecord, []string, error) {
	recs, bad, err := r.Records.ListBuilds()
	r.after()
	return recs, bad, err
}

// callQuiet is call for a goroutine: the tool call, its answer ignored.
func callQuiet(ctx context.Context, h *mcphost.Handler, toolUseID string) {
	for _, m := range []map[string]any{
		{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "claude-code", "version": "2.1.332"}}},
		{"jsonrpc": "2.0", "method": "notifications/initialized"},
		{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": map[string]any{"name": "run_build", "arguments": map[string]any{}, "_meta": map[string]any{"claudecode/toolUseId": toolUseID}}},
	} {
		b, _ := json.Marshal(m)
		if _, err := h.HandleMCP(ctx, b); err != nil {
			return
		}
	}
}
