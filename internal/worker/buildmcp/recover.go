package buildmcp

import (
	"context"
	"errors"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/buildjob"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// Deliverer appends an event to a conversation's event log as its owner,
// loading the conversation when no replica holds it (harness.Harness.Emit
// does). An error means it was not delivered: ErrGone (wrapped) when the
// conversation no longer exists, anything else (another replica owns it,
// the store is unavailable) to be tried again on the next pass.
type Deliverer func(conv string, t contract.EventType, payload any) error

// ErrGone is what a Deliverer returns (wrapped) for a deleted
// conversation: its build records are dropped.
var ErrGone = errors.New("conversation gone")

// JobReconciler is the level-based pass over the build Jobs of the
// worker's namespace (buildjob.Dispatcher): it deletes the Jobs expected
// does not claim and returns the others.
type JobReconciler interface {
	Reconcile(ctx context.Context, expected func(conversation, build string) bool) ([]buildjob.Existing, error)
}

var _ JobReconciler = (*buildjob.Dispatcher)(nil)

// Recover is one level-based pass after a worker (re)start, and then
// periodically (Run): every recorded build that no tool call of this
// worker follows gets its result delivered to its conversation.
//
//   - With jobs (Kubernetes): build Jobs no record names are deleted with
//     their pods (a deleted conversation's, a build whose result was
//     delivered); a recorded build whose Job exists is followed again to
//     its end in the background (adopted, not run again) and its
//     build_completed carries Recovered; one whose Job is gone (expired,
//     deleted while the worker was down) is reported failed, Lost.
//   - Without (local runner): the build's process ended with the old
//     worker; it is reported failed, WorkerRestarted.
//
// A conversation another replica owns is left to it (that replica's pass
// delivers); a deleted conversation's records are dropped. Errors are of
// the store or the API server; the pass goes as far as it can.
func (s *Server) Recover(ctx context.Context, deliver Deliverer, jobs JobReconciler) error {
	s.mu.Lock()
	detached := s.detached
	s.mu.Unlock()
	if detached || s.cfg.Runner == nil {
		return nil
	}
	type key struct{ conv, id string }
	var errs []error
	exists := map[key]bool{}
	if jobs != nil {
		// The Jobs are listed before the records are read (Reconcile reads
		// them through expected, once it has the list): a build's record is
		// written before its Job is made, so a Job listed has its record
		// read here unless its result was delivered since.
		var recorded map[key]bool
		keep, err := jobs.Reconcile(ctx, func(conv, build string) bool {
			if recorded == nil {
				recorded = map[key]bool{}
				recs, _, _ := s.cfg.Records.ListBuilds()
				for _, r := range recs {
					recorded[key{r.Conversation, r.ID}] = true
				}
			}
			s.mu.Lock()
			_, live := s.live[liveKey{conv, build}]
			s.mu.Unlock()
			return live || recorded[key{conv, build}]
		})
		if err != nil {
			// Without the list, a Job that exists must not be called lost.
			return err
		}
		for _, e := range keep {
			exists[key{e.Conversation, e.Build}] = true
		}
	}
	recs, bad, err := s.cfg.Records.ListBuilds()
	if err != nil {
		return err
	}
	s.mu.Lock()
	for _, name := range bad {
		if !s.warned[name] {
			s.warned[name] = true
			s.cfg.Logger.Warn("unreadable build record skipped (said once)", "file", name)
		}
	}
	s.mu.Unlock()
	for _, rec := range recs {
		lk := liveKey{rec.Conversation, rec.ID}
		s.mu.Lock()
		_, live := s.live[lk]
		s.mu.Unlock()
		if live {
			continue
		}
		// A build that ended since the list: its record went before it
		// stopped being live, and its result is delivered.
		if still, err := s.cfg.Records.HasBuild(rec.Conversation, rec.ID); err != nil || !still {
			continue
		}
		emit := func(t contract.EventType, p any) error { return deliver(rec.Conversation, t, p) }
		// Claim the conversation (and tell its followers) before anything
		// else: another replica's conversation is its own to recover.
		if err := emit(contract.EventBuildProgress, contract.BuildProgress{BuildID: rec.ID, State: contract.BuildRunning, Resumed: true}); err != nil {
			if errors.Is(err, ErrGone) {
				if err := s.cfg.Records.RemoveBuild(rec.Conversation, rec.ID); err != nil {
					errs = append(errs, err)
				}
				continue
			}
			s.cfg.Logger.Debug("build left to its conversation's owner", "conversation", rec.Conversation, "build", rec.ID, "err", err)
			continue
		}
		switch {
		case jobs == nil:
			s.deliver(rec, buildjob.Report{Runner: s.cfg.RunnerName, ExitCode: -1, Outcome: buildjob.Outcome{Phase: buildjob.PhaseFailed, Reason: "WorkerRestarted",
				Message: "the worker restarted while the build ran, and its process ended with it; run the build again"}}, nil, emit, true)
		case !exists[key{rec.Conversation, rec.ID}]:
			s.deliver(rec, buildjob.Report{Runner: s.cfg.RunnerName, ExitCode: -1, Outcome: buildjob.Outcome{Job: buildjob.JobName(buildjob.KindGradle, rec.Conversation, rec.ID),
				Phase: buildjob.PhaseFailed, Reason: "Lost", Message: "the build's Job no longer exists (it expired or was deleted while the worker was down); run the build again"}}, nil, emit, true)
		default:
			s.resume(ctx, rec, emit)
		}
	}
	return errors.Join(errs...)
}

// resume follows rec's existing Job to its end in the background and
// delivers its result.
func (s *Server) resume(ctx context.Context, rec sessionstore.BuildRecord, emit func(contract.EventType, any) error) {
	ctx, cancel := s.buildContext(ctx)
	lk := liveKey{rec.Conversation, rec.ID}
	s.mu.Lock()
	s.live[lk] = cancel
	s.mu.Unlock()
	s.cfg.Logger.Info("following a build again after a restart", "conversation", rec.Conversation, "build", rec.ID)
	go func() {
		defer func() {
			cancel()
			s.mu.Lock()
			delete(s.live, lk)
			s.mu.Unlock()
		}()
		req := buildjob.Request{Tenant: s.cfg.Tenant, Env: s.cfg.Env, Conversation: rec.Conversation, ID: rec.ID, RunAsUser: rec.UID}
		ev := newEmitter(rec.ID, emit, s.cfg.FlushEvery)
		rep, err := s.cfg.Runner.Run(ctx, req, buildjob.Spec{Tasks: rec.Tasks, Tests: rec.Tests}, buildjob.Hooks{Progress: ev.progress, Line: ev.line, Detach: s.detach})
		ev.close()
		if rep.Outcome.Phase == buildjob.PhaseDetached {
			return // the worker stops; the next one follows it
		}
		s.deliver(rec, rep, err, emit, true)
	}()
}

// Run runs Recover now and then every `every` (default 1 minute) until ctx
// ends, logging what a pass could not do.
func (s *Server) Run(ctx context.Context, deliver Deliverer, jobs JobReconciler, every time.Duration) {
	if every <= 0 {
		every = time.Minute
	}
	for {
		if err := s.Recover(ctx, deliver, jobs); err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("build recovery pass", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
