package buildjob

import (
	"context"
	"sync"
	"time"
)

// queue hands out at most max build slots at once; the builds beyond it
// wait in order and are told their place (1: next), again whenever it
// changes (checked each second). Both runners use one: the Dispatcher for
// Jobs in a namespace, LocalRunner for processes on the machine.
type queue struct {
	max int // set before first use

	mu      sync.Mutex
	running int             // slots handed out; guarded by mu
	waiters []chan struct{} // queued builds, in order; guarded by mu
}

// acquire waits for a slot, reporting the queue place as it changes; it
// returns ctx's error when ctx ends first (then it holds no slot).
func (q *queue) acquire(ctx context.Context, progress func(Progress)) error {
	q.mu.Lock()
	if q.running < q.max && len(q.waiters) == 0 {
		q.running++
		q.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	q.waiters = append(q.waiters, ch)
	place := len(q.waiters)
	q.mu.Unlock()
	progress(Progress{Queued: place})
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ch:
			return nil // release handed its slot over
		case <-ctx.Done():
			q.mu.Lock()
			defer q.mu.Unlock()
			for i, w := range q.waiters {
				if w == ch {
					q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
					return ctx.Err()
				}
			}
			// Handed a slot while cancelled: give it on.
			q.releaseLocked()
			return ctx.Err()
		case <-tick.C:
			q.mu.Lock()
			for i, w := range q.waiters {
				if w == ch && i+1 != place {
					place = i + 1
					q.mu.Unlock()
					progress(Progress{Queued: place})
					q.mu.Lock()
					break
				}
			}
			q.mu.Unlock()
		}
	}
}

// release gives a slot back: to the first waiter, if any.
func (q *queue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.releaseLocked()
}

func (q *queue) releaseLocked() {
	if len(q.waiters) > 0 {
		ch := q.waiters[0]
		q.waiters = q.waiters[1:]
		close(ch) // the slot passes to the first waiter
		return
	}
	q.running--
}
