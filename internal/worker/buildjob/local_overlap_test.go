package buildjob_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/worker/buildjob"
)

// TestLocalRunnerNeverOverlapsAWorkingTree (issue 27, fault 6): two builds
// of one conversation asked for at once never run at the same time (they
// share a working tree, and the second Gradle would time out on the
// tree's .gradle lock): the second is told it is queued and runs after the
// first, and a third, cancelled while it waits, never runs. Builds of two
// conversations do run side by side (MaxConcurrent 2). Each build writes
// when it started and ended into its working tree.
func TestLocalRunnerNeverOverlapsAWorkingTree(t *testing.T) {
	ws, tmpRoot, uid := localSetup(t)
	gradle := fakeGradle(t, tmpRoot, `for task; do :; done; echo "start $task $(date +%s%N)" >> times; sleep 1; echo "end $task $(date +%s%N)" >> times`)
	treeA, treeB := emptyTree(t, ws, "c_a", uid), emptyTree(t, ws, "c_b", uid)
	lr := &buildjob.LocalRunner{Gradle: gradle, WorkspaceRoot: ws, TmpRoot: tmpRoot, MaxConcurrent: 2}

	type result struct {
		task   string
		rep    buildjob.Report
		queued bool
	}
	results := make(chan result, 4)
	var wg sync.WaitGroup
	build := func(ctx context.Context, conv, task string, started chan<- struct{}) {
		defer wg.Done()
		req := localRequest(conv, uid)
		req.ID = "toolu_" + task
		var queued bool
		var mu sync.Mutex
		rep, err := lr.Run(ctx, req, buildjob.Spec{Tasks: []string{task}}, buildjob.Hooks{Progress: func(p buildjob.Progress) {
			mu.Lock()
			defer mu.Unlock()
			queued = queued || p.Queued > 0
			if p.Started && started != nil {
				close(started)
			}
		}})
		if err != nil {
			t.Errorf("build %s: %v", task, err)
		}
		mu.Lock()
		defer mu.Unlock()
		results <- result{task, rep, queued}
	}

	// One conversation: a1 runs; a2 and a3 wait for it; a3 is cancelled.
	a1Started := make(chan struct{})
	wg.Add(1)
	go build(t.Context(), "c_a", "a1", a1Started)
	<-a1Started
	cancelA3, stopA3 := context.WithCancel(t.Context())
	wg.Add(2)
	go build(t.Context(), "c_a", "a2", nil)
	go build(cancelA3, "c_a", "a3", nil)
	time.Sleep(200 * time.Millisecond)
	stopA3()
	wg.Wait()
	close(results)
	got := map[string]result{}
	for r := range results {
		got[r.task] = r
	}
	for _, task := range []string{"a1", "a2"} {
		if o := got[task].rep.Outcome; o.Phase != buildjob.PhaseSucceeded {
			t.Errorf("build %s: %+v\n%s", task, o, strings.Join(got[task].rep.LogTail, "\n"))
		}
	}
	if !got["a2"].queued {
		t.Error("the second build of the conversation was not told it is queued")
	}
	if o := got["a3"].rep.Outcome; o.Phase != buildjob.PhaseCancelled || o.Message != "cancelled while queued" {
		t.Errorf("the build cancelled while queued: %+v", o)
	}
	spans := buildSpans(t, treeA)
	if _, ran := spans["a3"]; ran || len(spans) != 2 {
		t.Fatalf("builds that ran in the conversation's tree: %v; want a1 and a2", spans)
	}
	if a1, a2 := spans["a1"], spans["a2"]; a2[0] < a1[1] {
		t.Errorf("two builds of one working tree overlapped: a1 ran %v, a2 started %v before a1 ended", a1, time.Duration(a1[1]-a2[0]))
	}

	// Two conversations run side by side.
	results = make(chan result, 2)
	bStarted := make(chan struct{})
	wg.Add(2)
	go build(t.Context(), "c_b", "b1", bStarted)
	<-bStarted
	go build(t.Context(), "c_a", "a4", nil)
	wg.Wait()
	close(results)
	for r := range results {
		if r.rep.Outcome.Phase != buildjob.PhaseSucceeded || r.queued {
			t.Errorf("build %s: %+v, queued %v; want it run at once", r.task, r.rep.Outcome, r.queued)
		}
	}
	b1, a4 := buildSpans(t, treeB)["b1"], buildSpans(t, treeA)["a4"]
	if a4[0] >= b1[1] {
		t.Errorf("builds of two conversations did not overlap: b1 ran %v, a4 %v", b1, a4)
	}
}

// buildSpans reads the start and end (Unix nanoseconds) of each build
// that ran in tree, by its task.
func buildSpans(t *testing.T, tree string) map[string][2]int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(tree, "times"))
	if err != nil {
		t.Fatal(err)
	}
	spans := map[string][2]int64{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			t.Fatalf("times: line %q", l)
		}
		ns, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		s := spans[f[1]]
		if f[0] == "start" {
			s[0] = ns
		} else {
			s[1] = ns
		}
		spans[f[1]] = s
	}
	for task, s := range spans {
		if s[0] == 0 || s[1] == 0 {
			t.Fatalf("build %s: start or end missing: %v", task, s)
		}
	}
	return spans
}
