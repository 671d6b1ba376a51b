package budget

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/talkide/talkide/internal/token"
)

// TestPostgresBatchesNeverDeadlock: two replicas commit batches of
// reservations for the same users queued in opposite orders, as
// concurrent traffic does; batches lock usage rows in user order, so no
// statement is aborted as a deadlock (each such abort stalled every
// reservation of its replica for PostgreSQL's deadlock_timeout).
func TestPostgresBatchesNeverDeadlock(t *testing.T) {
	db := stores["postgres"](t)
	a, b := newService(t, db, Config{}), newService(t, db, Config{})
	var deadlocks atomic.Int64
	var wg sync.WaitGroup
	for i, s := range []*Service{a, b} {
		users := []string{"ua", "ub", "uc", "ud"}
		if i == 1 {
			users = []string{"ud", "uc", "ub", "ua"}
		}
		wg.Go(func() {
			for range 60 {
				var batch []*op
				for _, u := range users {
					for range 4 {
						now := s.now()
						batch = append(batch, &op{ctx: context.Background(), done: make(chan error, 1),
							reserve: &reserveArgs{call: call(u, 1), id: token.NewID(), period: s.cfg.Period.Key(now), now: now}})
					}
				}
				s.reservePostgres(batch)
				for _, o := range batch {
					if err := <-o.done; err != nil {
						if strings.Contains(err.Error(), "deadlock") {
							deadlocks.Add(1)
						} else {
							t.Errorf("reserve: %v", err)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	if n := deadlocks.Load(); n > 0 {
		t.Errorf("%d reservations failed by deadlock", n)
	}
	if n := a.batchFailures.Load() + b.batchFailures.Load(); n > 0 {
		t.Errorf("%d batches failed and were retried one by one", n)
	}
}
