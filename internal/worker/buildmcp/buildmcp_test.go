package buildmcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/buildjob"
	"github.com/talkide/talkide/internal/worker/mcphost"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// fakeRunner stands in for a Runner where the test is about the tool, its
// events and its records; the runners have their own tests against real
// Gradle and the real test cluster.
type fakeRunner struct {
	mu    sync.Mutex
	calls []buildjob.Request
	run   func(ctx context.Context, req buildjob.Request, spec buildjob.Spec, h buildjob.Hooks) (buildjob.Report, error)
}

func (f *fakeRunner) Run(ctx context.Context, req buildjob.Request, spec buildjob.Spec, h buildjob.Hooks) (buildjob.Report, error) {
	f.mu.Lock()
	f.calls = append(f.calls, req)
	f.mu.Unlock()
	return f.run(ctx, req, spec, h)
}

func failingReport() buildjob.Report {
	var r buildjob.Results
	_ = r.ParseJUnit(strings.NewReader(`<testsuite name="com.acme.CalculatorTest" tests="2" failures="1">
<testcase classname="com.acme.CalculatorTest" name="adds"/>
<testcase classname="com.acme.CalculatorTest" name="multiplies"><failure message="expected:&lt;6&gt; but was:&lt;5&gt;" type="java.lang.AssertionError">java.lang.AssertionError: expected:&lt;6&gt; but was:&lt;5&gt;
	at org.junit.Assert.fail(Assert.java:89)
	at org.junit.Assert.failNotEquals(Assert.java:835)
	at com.acme.CalculatorTest.multiplies(CalculatorTest.java:14)
	at java.base/jdk.internal.reflect.NativeMethodAccessorImpl.invoke0(Native Method)</failure></testcase>
</testsuite>`))
	return buildjob.Report{Runner: "local", Outcome: buildjob.Outcome{Phase: buildjob.PhaseFailed, Reason: "ExitCode", Message: "gradle exited with 1"},
		ExitCode: 1, Results: r, LogTail: []string{"BUILD FAILED"}, DurationMS: 1234}
}

// events records what a conversation's event log got.
type events struct {
	mu  sync.Mutex
	got []contract.Event
}

func (e *events) emit(t contract.EventType, p any) {
	ev, err := contract.NewEvent("c1", t, p)
	if err != nil {
		panic(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, ev)
}

func (e *events) ofType(t contract.EventType) []contract.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []contract.Event
	for _, ev := range e.got {
		if ev.Type == t {
			out = append(out, ev)
		}
	}
	return out
}

func newServer(t *testing.T, r buildjob.Runner) (*Server, *sessionstore.Store) {
	t.Helper()
	store, err := sessionstore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{Runner: r, RunnerName: "local", Tenant: "acme", Env: "dev", Records: store, FlushEvery: 20 * time.Millisecond}), store
}

// call makes one run_build tool call as Claude Code does, with the tool
// call's id in _meta, and returns the result's text and isError.
func call(t *testing.T, ctx context.Context, h *mcphost.Handler, toolUseID string, args map[string]any) (string, bool) {
	t.Helper()
	msgs := []map[string]any{
		{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "claude-code", "version": "2.1.332"}}},
		{"jsonrpc": "2.0", "method": "notifications/initialized"},
		{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": map[string]any{"name": "run_build", "arguments": args, "_meta": map[string]any{"claudecode/toolUseId": toolUseID}}},
	}
	var last json.RawMessage
	for _, m := range msgs {
		b, _ := json.Marshal(m)
		resp, err := h.HandleMCP(ctx, b)
		if err != nil {
			t.Fatalf("%s: %v", m["method"], err)
		}
		last = resp
	}
	var out struct {
		Result struct {
			Content []struct{ Text string } `json:"content"`
			IsError bool                    `json:"isError"`
		} `json:"result"`
		Error *struct{ Message string } `json:"error"`
	}
	if err := json.Unmarshal(last, &out); err != nil || out.Error != nil || len(out.Result.Content) == 0 {
		t.Fatalf("tools/call answer %s (%v)", last, err)
	}
	return out.Result.Content[0].Text, out.Result.IsError
}

// A build the agent asks for is recorded, runs as the agent's uid under
// the tool call's id, streams its log as build_progress events, ends with
// a build_completed naming the failed test and its message, and gives the
// agent a result it can act on; its record is gone after.
func TestRunBuildReportsFailedTests(t *testing.T) {
	var recorded []sessionstore.BuildRecord
	var store *sessionstore.Store
	r := &fakeRunner{run: func(ctx context.Context, req buildjob.Request, spec buildjob.Spec, h buildjob.Hooks) (buildjob.Report, error) {
		recorded, _, _ = store.ListBuilds()
		h.Progress(buildjob.Progress{Queued: 1})
		h.Progress(buildjob.Progress{Started: true})
		for i := range 450 {
			h.Line("line " + string(rune('a'+i%26)))
		}
		return failingReport(), nil
	}}
	srv, st := newServer(t, r)
	store = st
	var ev events
	h, err := srv.Open(Conversation{ID: "c1", UID: 20001, Emit: ev.emit})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	text, isErr := call(t, t.Context(), h, "toolu_01abc", map[string]any{"tests": "com.acme.*"})
	if !isErr || !strings.Contains(text, "BUILD FAILED") || !strings.Contains(text, "FAILED com.acme.CalculatorTest.multiplies: expected:<6> but was:<5>") ||
		!strings.Contains(text, "CalculatorTest.java:14") || !strings.Contains(text, "Tests: 2 run, 1 failed") ||
		strings.Contains(text, "org.junit.Assert") || strings.Contains(text, "NativeMethodAccessorImpl") {
		t.Errorf("tool result (error %v):\n%s", isErr, text)
	}
	if len(r.calls) != 1 || r.calls[0].ID != "toolu_01abc" || r.calls[0].RunAsUser != 20001 || r.calls[0].Conversation != "c1" || r.calls[0].Tenant != "acme" {
		t.Errorf("runner asked %+v", r.calls)
	}
	if len(recorded) != 1 || recorded[0].ID != "toolu_01abc" || recorded[0].Tests != "com.acme.*" || recorded[0].Tasks[0] != "test" {
		t.Errorf("recorded while running: %+v", recorded)
	}
	if left, _, _ := store.ListBuilds(); len(left) != 0 {
		t.Errorf("records after the build: %+v", left)
	}
	started := ev.ofType(contract.EventBuildStarted)
	if len(started) != 1 || !strings.Contains(string(started[0].Data), `"build_id":"toolu_01abc"`) {
		t.Errorf("build_started %v", started)
	}
	lines, states := 0, []string{}
	for _, e := range ev.ofType(contract.EventBuildProgress) {
		var p contract.BuildProgress
		_ = json.Unmarshal(e.Data, &p)
		if len(p.Lines) > contract.MaxBuildLinesPerEvent {
			t.Errorf("an event of %d lines", len(p.Lines))
		}
		lines += len(p.Lines)
		if p.State != "" {
			states = append(states, p.State)
		}
	}
	if lines != 450 || strings.Join(states, ",") != "queued,running" {
		t.Errorf("progress: %d lines, states %v", lines, states)
	}
	done := ev.ofType(contract.EventBuildCompleted)
	var c contract.BuildCompleted
	if len(done) != 1 || json.Unmarshal(done[0].Data, &c) != nil || c.Phase != "failed" || c.Failures != 1 || c.Tests != 2 ||
		len(c.Failed) != 1 || c.Failed[0].Name != "multiplies" || c.Failed[0].Message != "expected:<6> but was:<5>" || c.ExitCode != 1 {
		t.Errorf("build_completed %v", done)
	}
	if all := ev.got; all[len(all)-1].Type != contract.EventBuildCompleted {
		t.Errorf("an event after build_completed: %s", all[len(all)-1].Type)
	}
}

// What is not a task name or a test pattern never reaches a runner.
func TestRunBuildRefusesOptions(t *testing.T) {
	r := &fakeRunner{run: func(context.Context, buildjob.Request, buildjob.Spec, buildjob.Hooks) (buildjob.Report, error) {
		return buildjob.Report{}, errors.New("must not run")
	}}
	srv, _ := newServer(t, r)
	var ev events
	h, _ := srv.Open(Conversation{ID: "c1", UID: 20001, Emit: ev.emit})
	defer h.Close()
	for _, args := range []map[string]any{
		{"tasks": []string{"--init-script=/tmp/evil.gradle"}},
		{"tasks": []string{"test", "-Dorg.gradle.jvmargs=x"}},
		{"tests": "X --init-script y"},
		{"tests": "-PfooBar"},
	} {
		text, isErr := call(t, t.Context(), h, "toolu_x", args)
		if !isErr || !strings.Contains(text, "Invalid arguments") {
			t.Errorf("%v: %q", args, text)
		}
	}
	if len(r.calls) != 0 || len(ev.got) != 0 {
		t.Errorf("runner calls %v, events %v", r.calls, ev.got)
	}
}

// An interrupted turn (the tool call's context ends) cancels the build,
// and the conversation sees it cancelled.
func TestInterruptCancelsTheBuild(t *testing.T) {
	cancelled := make(chan struct{})
	r := &fakeRunner{run: func(ctx context.Context, req buildjob.Request, spec buildjob.Spec, h buildjob.Hooks) (buildjob.Report, error) {
		<-ctx.Done()
		close(cancelled)
		return buildjob.Report{Outcome: buildjob.Outcome{Phase: buildjob.PhaseCancelled, Reason: "Cancelled"}, ExitCode: -1}, nil
	}}
	srv, store := newServer(t, r)
	var ev events
	h, _ := srv.Open(Conversation{ID: "c1", UID: 20001, Emit: ev.emit})
	defer h.Close()
	ctx, interrupt := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, interrupt)
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "c", "version": "1"}}})
	if _, err := h.HandleMCP(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": map[string]any{"name": "run_build", "arguments": map[string]any{}}})
	go h.HandleMCP(ctx, b) //nolint:errcheck // the answer goes nowhere: the call was interrupted
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the build was not cancelled")
	}
	for deadline := time.Now().Add(5 * time.Second); len(ev.ofType(contract.EventBuildCompleted)) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no build_completed")
		}
	}
	if c := ev.ofType(contract.EventBuildCompleted); !strings.Contains(string(c[0].Data), `"phase":"cancelled"`) {
		t.Errorf("build_completed %s", c[0].Data)
	}
	if left, _, _ := store.ListBuilds(); len(left) != 0 {
		t.Errorf("records of a cancelled build: %+v", left)
	}
}

// A worker that stops (Detach) leaves its builds running and recorded:
// the tool call ends without cancelling the build, and the next worker's
// Recover follows the build's Job again and delivers its result, marked
// recovered, through the conversation's owner.
func TestRestartDeliversTheResult(t *testing.T) {
	started := make(chan struct{})
	first := &fakeRunner{run: func(ctx context.Context, req buildjob.Request, spec buildjob.Spec, h buildjob.Hooks) (buildjob.Report, error) {
		close(started)
		select {
		case <-h.Detach:
			return buildjob.Report{Outcome: buildjob.Outcome{Phase: buildjob.PhaseDetached}, ExitCode: -1}, nil
		case <-ctx.Done():
			return buildjob.Report{Outcome: buildjob.Outcome{Phase: buildjob.PhaseCancelled}, ExitCode: -1}, nil
		}
	}}
	srv, store := newServer(t, first)
	var ev events
	h, _ := srv.Open(Conversation{ID: "c1", UID: 20001, Emit: ev.emit})
	result := make(chan string, 1)
	go func() {
		text, _ := call(t, t.Context(), h, "toolu_restart", map[string]any{})
		result <- text
	}()
	<-started
	srv.Detach() // the worker stops
	if text := <-result; !strings.Contains(text, "restarting") {
		t.Errorf("tool result of a detached build: %q", text)
	}
	h.Close()
	if recs, _, _ := store.ListBuilds(); len(recs) != 1 {
		t.Fatalf("records after the worker stopped: %+v; want the build kept", recs)
	}

	// The restarted worker.
	second := &fakeRunner{run: func(ctx context.Context, req buildjob.Request, spec buildjob.Spec, h buildjob.Hooks) (buildjob.Report, error) {
		return failingReport(), nil
	}}
	next := New(Config{Runner: second, RunnerName: "kubernetes", Tenant: "acme", Env: "dev", Records: store, FlushEvery: 20 * time.Millisecond})
	jobs := &fakeJobs{existing: []buildjob.Existing{{Conversation: "c1", Build: "toolu_restart", Finished: true}}}
	var delivered events
	owner := "other-replica"
	deliver := func(conv string, t contract.EventType, p any) error {
		if owner != "" {
			return errors.New("owned by " + owner)
		}
		delivered.emit(t, p)
		return nil
	}
	if err := next.Recover(t.Context(), deliver, jobs); err != nil {
		t.Fatal(err)
	}
	if len(second.calls) != 0 {
		t.Fatalf("a build another replica owns was followed")
	}
	owner = ""
	if err := next.Recover(t.Context(), deliver, jobs); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); len(delivered.ofType(contract.EventBuildCompleted)) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no build_completed after the restart")
		}
	}
	var c contract.BuildCompleted
	_ = json.Unmarshal(delivered.ofType(contract.EventBuildCompleted)[0].Data, &c)
	if !c.Recovered || c.Failures != 1 || c.Failed[0].Message != "expected:<6> but was:<5>" {
		t.Errorf("delivered %+v", c)
	}
	if len(second.calls) != 1 || second.calls[0].ID != "toolu_restart" || second.calls[0].RunAsUser != 20001 {
		t.Errorf("followed %+v", second.calls)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if recs, _, _ := store.ListBuilds(); len(recs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the delivered build's record is still there")
		}
	}
	if err := next.Recover(t.Context(), deliver, jobs); err != nil {
		t.Fatal(err)
	}
	// The follower stops being live just after it removed the record.
	for deadline := time.Now().Add(5 * time.Second); jobs.expected("c1", "toolu_restart"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("after delivery, the reconcile pass was told to keep the build's Job")
		}
	}
}

// After a restart, a recorded build whose Job is gone is reported lost; a
// local build (which ended with the old worker) is reported cut off; a
// deleted conversation's records are dropped.
func TestRecoverWithoutAJob(t *testing.T) {
	for _, c := range []struct {
		name   string
		jobs   JobReconciler
		reason string
	}{
		{"kubernetes", &fakeJobs{}, "Lost"},
		{"local", nil, "WorkerRestarted"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &fakeRunner{run: func(context.Context, buildjob.Request, buildjob.Spec, buildjob.Hooks) (buildjob.Report, error) {
				return buildjob.Report{}, errors.New("must not run again")
			}}
			srv, store := newServer(t, r)
			for _, rec := range []sessionstore.BuildRecord{{Conversation: "c1", ID: "toolu_a", Tasks: []string{"test"}, UID: 20001}, {Conversation: "gone", ID: "toolu_b", Tasks: []string{"test"}, UID: 20002}} {
				if err := store.PutBuild(rec); err != nil {
					t.Fatal(err)
				}
			}
			var ev events
			deliver := func(conv string, t contract.EventType, p any) error {
				if conv == "gone" {
					return ErrGone
				}
				ev.emit(t, p)
				return nil
			}
			if err := srv.Recover(t.Context(), deliver, c.jobs); err != nil {
				t.Fatal(err)
			}
			done := ev.ofType(contract.EventBuildCompleted)
			if len(done) != 1 || !strings.Contains(string(done[0].Data), `"reason":"`+c.reason+`"`) || !strings.Contains(string(done[0].Data), `"recovered":true`) {
				t.Errorf("delivered %v", done)
			}
			if len(r.calls) != 0 {
				t.Errorf("a build ran again: %+v", r.calls)
			}
			if recs, _, _ := store.ListBuilds(); len(recs) != 0 {
				t.Errorf("records left: %+v", recs)
			}
		})
	}
}

type fakeJobs struct {
	existing []buildjob.Existing
	expected func(conv, build string) bool
}

func (f *fakeJobs) Reconcile(_ context.Context, expected func(conv, build string) bool) ([]buildjob.Existing, error) {
	f.expected = expected
	var keep []buildjob.Existing
	for _, e := range f.existing {
		if expected(e.Conversation, e.Build) {
			keep = append(keep, e)
		}
	}
	return keep, nil
}

// Without a runner the tool says why builds are off and records nothing.
func TestUnavailable(t *testing.T) {
	store, _ := sessionstore.Open(t.TempDir())
	srv := New(Config{Unavailable: "gradle is not installed on this machine.", Records: store})
	var ev events
	h, _ := srv.Open(Conversation{ID: "c1", UID: 1000, Emit: ev.emit})
	defer h.Close()
	text, isErr := call(t, t.Context(), h, "toolu_1", map[string]any{})
	if !isErr || !strings.Contains(text, "gradle is not installed") || len(ev.got) != 0 {
		t.Errorf("%v %q %v", isErr, text, ev.got)
	}
}

// A build that logs long lines, and fails many tests with long messages,
// stays within bounds: each event's lines and all of a build's lines in
// bytes, and the agent's tool result, which names the failures beyond its
// budget instead of being cut by the CLI (cases from the review of issue
// 14: 82 MB of event log from one build; a tool result of 107,000
// characters of which the model saw three failures).
func TestBuildOutputIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`<testsuite name="com.acme.ListTest">`)
	for i := range 60 {
		fmt.Fprintf(&b, `<testcase classname="com.acme.ListTest" name="case%d"><failure message="%s">java.lang.AssertionError: %s
	at org.junit.Assert.fail(Assert.java:89)
	at com.acme.ListTest.case%d(ListTest.java:%d)</failure></testcase>`, i, strings.Repeat("m", 1500), strings.Repeat("m", 1500), i, i)
	}
	b.WriteString(`</testsuite>`)
	var res buildjob.Results
	if err := res.ParseJUnit(strings.NewReader(b.String())); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("é", 20000)
	r := &fakeRunner{run: func(ctx context.Context, req buildjob.Request, spec buildjob.Spec, h buildjob.Hooks) (buildjob.Report, error) {
		for range 6000 {
			h.Line(long)
		}
		return buildjob.Report{Outcome: buildjob.Outcome{Phase: buildjob.PhaseFailed, Reason: "ExitCode"}, ExitCode: 1, Results: res,
			LogTail: slices.Repeat([]string{long}, 40)}, nil
	}}
	srv, _ := newServer(t, r)
	var ev events
	h, _ := srv.Open(Conversation{ID: "c1", UID: 20001, Emit: ev.emit})
	defer h.Close()
	text, _ := call(t, t.Context(), h, "toolu_big", map[string]any{})
	if len(text) > 20000 || !strings.Contains(text, "FAILED com.acme.ListTest.case0: ") || !strings.Contains(text, "more failed: com.acme.ListTest.case") ||
		strings.Contains(text, "org.junit.Assert") || !strings.Contains(text, "ListTest.java:0") {
		t.Errorf("tool result of %d bytes:\n%s", len(text), text[:min(len(text), 3000)])
	}
	total, truncated := 0, false
	for _, e := range append(ev.ofType(contract.EventBuildProgress), ev.ofType(contract.EventBuildCompleted)...) {
		if len(e.Data) > contract.MaxBuildEventBytes+64<<10 {
			t.Errorf("a %s event of %d bytes", e.Type, len(e.Data))
		}
		total += len(e.Data)
		var p contract.BuildProgress
		_ = json.Unmarshal(e.Data, &p)
		truncated = truncated || p.Truncated
	}
	if total > 2*contract.MaxBuildLogBytes+200<<10 || !truncated {
		t.Errorf("the build's events hold %d bytes (truncated %v)", total, truncated)
	}
}

// TestTruncatedReportsAreSaid: where the worker stopped reading a report
// (nested too deep, here), the agent's tool result and build_completed say
// so, and the counts are of what was read.
func TestTruncatedReportsAreSaid(t *testing.T) {
	doc := `<testsuite name="S"><testcase classname="S" name="ok"/>` + strings.Repeat("<a>", 100) + strings.Repeat("</a>", 100) + `</testsuite>`
	var res buildjob.Results
	if err := res.ParseJUnit(strings.NewReader(doc)); err != nil {
		t.Fatal(err)
	}
	if len(res.Truncated) == 0 {
		t.Fatalf("no truncation note for a report nested 100 deep: %+v", res)
	}
	r := &fakeRunner{run: func(ctx context.Context, req buildjob.Request, spec buildjob.Spec, h buildjob.Hooks) (buildjob.Report, error) {
		return buildjob.Report{Outcome: buildjob.Outcome{Phase: buildjob.PhaseSucceeded}, Results: res}, nil
	}}
	srv, _ := newServer(t, r)
	var ev events
	h, _ := srv.Open(Conversation{ID: "c1", UID: 20001, Emit: ev.emit})
	defer h.Close()
	text, _ := call(t, t.Context(), h, "toolu_trunc", map[string]any{})
	if !strings.Contains(text, "The test reports were not read whole: ") || !strings.Contains(text, "Tests: 1 run") {
		t.Errorf("tool result:\n%s", text)
	}
	done := ev.ofType(contract.EventBuildCompleted)
	var bc contract.BuildCompleted
	if len(done) != 1 || json.Unmarshal(done[0].Data, &bc) != nil || len(bc.ReportsTruncated) == 0 {
		t.Errorf("build_completed: %v", done)
	}
}
