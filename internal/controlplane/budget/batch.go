package budget

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
)

// run queues o for the writer and waits until it is committed (or failed).
// A caller whose ctx ends while o is queued gets ctx's error and o is
// skipped; once the writer took o, run waits for its outcome regardless of
// ctx, so a caller always learns whether a reservation was made.
func (s *Service) run(ctx context.Context, o *op) error {
	o.ctx, o.done = ctx, make(chan error, 1)
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	select {
	case s.ops <- o:
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	s.mu.RUnlock()
	return <-o.done
}

// enqueue queues reservation o for the next batch (see lead). Reservations
// are committed in the order they were queued, so a call this process
// admitted first is never refused because a later one took its budget.
func (s *Service) enqueue(ctx context.Context, o *op) error {
	o.ctx, o.done = ctx, make(chan error, 1)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	s.qmu.Lock()
	s.queue = append(s.queue, o)
	s.qmu.Unlock()
	return nil
}

// lead waits until queued reservation o is committed, without a hand-off to
// a goroutine: whichever waiting caller gets the leader's token first
// commits everything queued, on its own goroutine, as one batch (group
// commit: under load one commit serves many calls; alone, a call pays no
// goroutine switch). On SQLite the token is the writer's connection and the
// batch one transaction; on PostgreSQL the batch is one statement on a
// pooled connection (reservePostgres). A caller whose op another leader
// took returns as soon as it is done.
func (s *Service) lead(o *op) error {
	token := s.conn
	if s.db.Dialect == controlstore.Postgres {
		token = s.pgLeader
	}
	for {
		select {
		case err := <-o.done:
			return err
		case <-o.ctx.Done():
			// Still queued: take it back, nothing was written. Taken by a
			// leader: wait for its outcome, so the caller learns whether
			// a reservation was made.
			if s.unqueue(o) {
				return o.ctx.Err()
			}
			return <-o.done
		case token <- struct{}{}:
			s.qmu.Lock()
			batch := s.queue
			s.queue = nil
			s.qmu.Unlock()
			if len(batch) > 0 {
				s.commitReserves(batch)
			}
			<-token
		}
	}
}

// unqueue removes o from the queue; false when a leader has taken it.
func (s *Service) unqueue(o *op) bool {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	for i, q := range s.queue {
		if q == o {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return true
		}
	}
	return false
}

// commitReserves commits a batch of queued reservations; the caller holds
// the leader's token.
func (s *Service) commitReserves(batch []*op) {
	if s.db.Dialect == controlstore.Postgres {
		s.reservePostgres(batch)
		return
	}
	s.commitHeld(batch)
}

// maxBatch bounds the operations committed in one transaction.
const maxBatch = 128

// writer commits queued operations in batches until Close, then commits what
// is left. Every expiry sweep also runs here.
func (s *Service) writer() {
	defer close(s.done)
	defer func() {
		s.conn <- struct{}{}
		s.pgLeader <- struct{}{}
		// Reservations queued before Close but not yet led.
		s.qmu.Lock()
		left := s.queue
		s.queue = nil
		s.qmu.Unlock()
		if len(left) > 0 {
			s.commitReserves(left)
		}
		<-s.pgLeader
		if s.w != nil {
			s.w.Close()
			s.w.conn.Close()
			s.w = nil
		}
		s.connGone = true
		<-s.conn
	}()
	sweep := time.NewTicker(min(s.cfg.ReservationTTL/4, time.Minute))
	defer sweep.Stop()
	// Settlements wait up to SettleDelay for company: nobody waits on them
	// but the gateway's background goroutine, and committing many in one
	// transaction writes each page once and keeps the writer free for
	// reservations, which callers do wait on.
	var settles []*op
	settleTimer := time.NewTimer(time.Hour)
	settleTimer.Stop()
	flushSettles := func() {
		// In chunks, handing the connection back in between, so a
		// reservation never waits behind more than one chunk.
		for len(settles) > 0 {
			n := min(len(settles), maxSettleBatch)
			s.commit(settles[:n])
			settles = settles[n:]
		}
		settles = nil
	}
	batch := make([]*op, 0, maxBatch)
	for {
		select {
		case o := <-s.ops:
			batch = append(batch[:0], o)
		drain:
			for len(batch) < maxBatch {
				select {
				case o := <-s.ops:
					batch = append(batch, o)
				default:
					break drain
				}
			}
			now := batch[:0:0]
			for _, o := range batch {
				if o.settle != nil {
					if len(settles) == 0 {
						settleTimer.Reset(SettleDelay)
					}
					settles = append(settles, o)
					continue
				}
				now = append(now, o)
			}
			if len(now) > 0 {
				s.commit(now)
			}
			if len(settles) >= maxSettleBatch {
				settleTimer.Stop()
				flushSettles()
			}
		case <-settleTimer.C:
			flushSettles()
		case <-sweep.C:
			s.evictViews(s.now())
			flushSettles()
			o := &op{ctx: context.Background(), expire: &expireArgs{now: s.now()}, done: make(chan error, 1)}
			s.commit([]*op{o})
			if err := <-o.done; err != nil {
				s.log.Error("expire budget reservations", "err", err)
			}
		case <-s.quit:
			flushSettles()
			for {
				select {
				case o := <-s.ops:
					s.commit([]*op{o})
				default:
					return
				}
			}
		}
	}
}

// SettleDelay is the longest a settlement waits to be committed with
// others (see writer).
const SettleDelay = 5 * time.Millisecond

// maxSettleBatch bounds the settlements committed in one transaction (a few
// milliseconds of work a reservation may wait behind).
const maxSettleBatch = 32

// commit runs ops in one transaction, holding the connection token.
func (s *Service) commit(ops []*op) {
	s.conn <- struct{}{}
	s.commitHeld(ops)
	<-s.conn
}

// commitHeld runs ops in one transaction; the caller holds the connection
// token. When any fails, the transaction is
// rolled back and each op is retried in its own, so one bad op cannot fail
// the others.
func (s *Service) commitHeld(ops []*op) {
	if s.connGone {
		for _, o := range ops {
			s.finish(o, ErrClosed)
		}
		return
	}
	live := s.live(ops)
	if len(live) == 0 {
		return
	}
	if s.db.Dialect == controlstore.Postgres {
		byUser(live) // row locks in one order everywhere: no deadlocks
	}
	if err := s.tx(live); err == nil || len(live) == 1 {
		for _, o := range live {
			s.finish(o, err)
		}
	} else {
		for _, o := range live {
			s.finish(o, s.tx([]*op{o}))
		}
	}
	s.dirty.Store(true)
}

// live ends the ops whose caller gave up before anything was written and
// returns the others, counting them as one batch.
func (s *Service) live(ops []*op) []*op {
	live := ops[:0:0]
	for _, o := range ops {
		if err := o.ctx.Err(); err != nil {
			s.finish(o, err)
			continue
		}
		live = append(live, o)
	}
	if len(live) > 0 {
		s.cfg.Metrics.observeBatch(len(live))
	}
	return live
}

// byUser orders a batch by user, keeping each user's calls in the order
// they were admitted: every transaction that locks several users' usage
// rows (reservation batches, settlement batches, expiry sweeps, on any
// replica) locks them in this order, so none waits for another in a cycle.
func byUser(ops []*op) {
	slices.SortStableFunc(ops, func(a, b *op) int { return strings.Compare(a.user(), b.user()) })
}

func (o *op) user() string {
	switch {
	case o.reserve != nil:
		return o.reserve.call.UserID
	case o.settle != nil:
		return o.settle.res.UserID
	}
	return ""
}
