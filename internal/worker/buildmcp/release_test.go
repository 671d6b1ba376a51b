package buildmcp

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/buildjob"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// releasingRunner is a fakeRunner whose builds leave a Job behind until
// released (as buildjob.KubeRunner's do).
type releasingRunner struct {
	fakeRunner
	mu       sync.Mutex
	released []string // build ids; guarded by mu
}

func (r *releasingRunner) Release(_ context.Context, req buildjob.Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.released = append(r.released, req.Conversation+"/"+req.ID)
	return nil
}

func (r *releasingRunner) releasedIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.released)
}

// A build's Job is released (deleted) as soon as its result is delivered
// and its record removed, not at the next recovery pass: a finished Job
// holds the namespace's Job quota. One whose result could not be
// delivered keeps its Job for the next pass to deliver it from, and is
// released after that pass delivers; a cancelled build's Job is deleted
// by the runner already, and a build that could not run is not released.
func TestDeliveredBuildsAreReleased(t *testing.T) {
	r := &releasingRunner{}
	r.run = func(ctx context.Context, req buildjob.Request, spec buildjob.Spec, h buildjob.Hooks) (buildjob.Report, error) {
		switch req.ID {
		case "toolu_cancelled":
			return buildjob.Report{Outcome: buildjob.Outcome{Phase: buildjob.PhaseCancelled}, ExitCode: -1}, nil
		case "toolu_notrun":
			return buildjob.Report{ExitCode: -1}, errors.New("build Job exists for another build")
		}
		return failingReport(), nil
	}
	srv, store := newServer(t, r)
	for _, id := range []string{"toolu_done", "toolu_cancelled", "toolu_notrun"} {
		var ev events
		h, err := srv.Open(Conversation{ID: "c1", UID: 20001, Emit: ev.emit})
		if err != nil {
			t.Fatal(err)
		}
		call(t, t.Context(), h, id, map[string]any{})
		h.Close()
	}
	if got := r.releasedIDs(); !slices.Equal(got, []string{"c1/toolu_done"}) {
		t.Errorf("released %v; want the delivered build's only", got)
	}

	// A result recovered after a restart, first not delivered, then
	// delivered.
	if err := store.PutBuild(recordOf("c2", "toolu_recovered")); err != nil {
		t.Fatal(err)
	}
	next := New(Config{Runner: r, RunnerName: "kubernetes", Tenant: "acme", Env: "dev", Records: store})
	jobs := &fakeJobs{existing: []buildjob.Existing{{Conversation: "c2", Build: "toolu_recovered", Finished: true}}}
	var mu sync.Mutex
	refuse := true
	delivered := make(chan struct{}, 4)
	deliver := func(conv string, typ contract.EventType, p any) error {
		mu.Lock()
		defer mu.Unlock()
		if typ != contract.EventBuildCompleted {
			return nil
		}
		if refuse {
			delivered <- struct{}{}
			return errors.New("the event store is unavailable")
		}
		delivered <- struct{}{}
		return nil
	}
	if err := next.Recover(t.Context(), deliver, jobs); err != nil {
		t.Fatal(err)
	}
	<-delivered
	waitNotLive(t, next, "c2", "toolu_recovered")
	if got := r.releasedIDs(); slices.Contains(got, "c2/toolu_recovered") {
		t.Fatalf("released %v after a delivery that failed; want the Job kept for the next pass", got)
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	if err := next.Recover(t.Context(), deliver, jobs); err != nil {
		t.Fatal(err)
	}
	<-delivered
	waitNotLive(t, next, "c2", "toolu_recovered")
	if got := r.releasedIDs(); !slices.Contains(got, "c2/toolu_recovered") {
		t.Errorf("released %v; want the recovered build's Job released once delivered", got)
	}
}

func recordOf(conv, id string) sessionstore.BuildRecord {
	return sessionstore.BuildRecord{Conversation: conv, ID: id, Runner: "kubernetes", Tasks: []string{"test"}, UID: 20001, Started: time.Now().UTC()}
}

// waitNotLive waits until no follower of s follows conv's build id (a
// recovered build's ends after its delivery).
func waitNotLive(t *testing.T, s *Server, conv, id string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		_, live := s.live[liveKey{conv, id}]
		s.mu.Unlock()
		if !live {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("build %s/%s still followed", conv, id)
		}
	}
}
