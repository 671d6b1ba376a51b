package buildmcp

import (
	"sync"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/buildjob"
)

// emitter turns a build's progress and log lines into build_progress
// events: a state change at once (with the lines before it), lines in
// batches of at most contract.MaxBuildLinesPerEvent, sent at least every
// flush, and no more than contract.MaxBuildLogLines lines in all, so a
// chatty build cannot flood its conversation's event log.
type emitter struct {
	id   string
	emit func(contract.EventType, any) error

	mu           sync.Mutex
	pending      []string // guarded by mu
	pendingBytes int      // guarded by mu
	sent         int      // lines sent in all; guarded by mu
	sentBytes    int      // their bytes; guarded by mu
	cut          bool     // the Truncated event was sent; guarded by mu
	stop         chan struct{}
	stopped      chan struct{}
}

func newEmitter(id string, emit func(contract.EventType, any) error, flush time.Duration) *emitter {
	e := &emitter{id: id, emit: emit, stop: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(e.stopped)
		t := time.NewTicker(flush)
		defer t.Stop()
		for {
			select {
			case <-e.stop:
				return
			case <-t.C:
				e.mu.Lock()
				e.flushLocked(contract.BuildProgress{})
				e.mu.Unlock()
			}
		}
	}()
	return e
}

// flushLocked sends the pending lines in p (a state change, or nothing).
func (e *emitter) flushLocked(p contract.BuildProgress) {
	if len(e.pending) == 0 && p.State == "" && !p.Truncated {
		return
	}
	p.BuildID, p.Lines = e.id, e.pending
	e.pending, e.pendingBytes = nil, 0
	_ = e.emit(contract.EventBuildProgress, p)
}

func (e *emitter) progress(p buildjob.Progress) {
	ev := contract.BuildProgress{State: contract.BuildRunning, PodPhase: p.PodPhase}
	if p.Queued > 0 {
		ev.State, ev.QueuePlace = contract.BuildQueued, p.Queued
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.flushLocked(ev)
}

func (e *emitter) line(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s = clip(s, contract.MaxBuildLineBytes)
	if e.sent >= contract.MaxBuildLogLines || e.sentBytes+len(s) > contract.MaxBuildLogBytes {
		if !e.cut {
			e.cut = true
			e.flushLocked(contract.BuildProgress{Truncated: true})
		}
		return
	}
	if e.pendingBytes+len(s) > contract.MaxBuildEventBytes {
		e.flushLocked(contract.BuildProgress{})
	}
	e.pending = append(e.pending, s)
	e.pendingBytes += len(s)
	e.sent++
	e.sentBytes += len(s)
	if len(e.pending) == contract.MaxBuildLinesPerEvent {
		e.flushLocked(contract.BuildProgress{})
	}
}

// close sends what is pending and stops the timer.
func (e *emitter) close() {
	close(e.stop)
	<-e.stopped
	e.mu.Lock()
	defer e.mu.Unlock()
	e.flushLocked(contract.BuildProgress{})
}
