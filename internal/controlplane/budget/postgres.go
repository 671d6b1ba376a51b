package budget

import (
	"context"
	"fmt"
	"time"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
)

// reservePostgres runs a batch of pre-call checks as one statement that
// calls the talkide_budget_reserve function (controlstore/pgsql) once per
// reservation, in one transaction on a pooled connection: ordered by user,
// each user's in the order they were admitted (byUser). When the statement
// fails, each reservation is retried in a statement of its own, so one bad
// reservation cannot fail the others.
func (s *Service) reservePostgres(batch []*op) {
	live := s.live(batch)
	if len(live) == 0 {
		return
	}
	byUser(live)
	err := s.reservePostgresBatch(live)
	if err == nil {
		for _, o := range live {
			s.finish(o, nil)
		}
		return
	}
	s.batchFailures.Add(1)
	s.log.Warn("budget reservation batch failed; retrying each reservation alone", "reservations", len(live), "err", err)
	for _, o := range live {
		err := s.reservePostgresBatch([]*op{o})
		if err != nil && s.reservedBefore(o.reserve) {
			err = nil
		}
		s.finish(o, err)
	}
}

// reservedBefore reports whether r's reservation is in the database
// although its statement failed (it committed, then the answer was lost):
// then it was admitted, and its view numbers are unknown.
func (s *Service) reservedBefore(r *reserveArgs) bool {
	var one int
	if s.db.SQL.QueryRowContext(context.Background(), `SELECT 1 FROM budget_reservations WHERE id = $1`, r.id).Scan(&one) != nil {
		return false
	}
	r.outcome, r.limit = "ok", -1
	return true
}

// reserveBatchTimeout bounds one batch statement: a row lock held for
// longer (a stuck transaction elsewhere) fails the batch instead of
// stalling every reservation of this process behind it.
const reserveBatchTimeout = 30 * time.Second

func (s *Service) reservePostgresBatch(ops []*op) error {
	f := s.cfg.FairUse
	var window int64
	if f.on() {
		window = f.Window.Milliseconds()
	}
	n := len(ops)
	ids, ledgerIDs, users, tenants, envs := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	convs, models, reqIDs, periods := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	amounts, estimates, nows, expires := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, o := range ops {
		r := o.reserve
		c := r.call
		ids[i], ledgerIDs[i], users[i], tenants[i], envs[i] = r.id, ledgerID(), c.UserID, c.Tenant, c.Env
		convs[i], models[i], reqIDs[i], periods[i] = c.ConversationID, c.Model, c.RequestID, r.period
		amounts[i], estimates[i] = int64(c.Amount), c.EstimatedTokens
		nows[i], expires[i] = controlstore.Millis(r.now), controlstore.Millis(r.now.Add(s.cfg.ReservationTTL))
	}
	ctx, cancel := context.WithTimeout(context.Background(), reserveBatchTimeout)
	defer cancel()
	rows, err := s.db.SQL.QueryContext(ctx, `SELECT r.outcome, r.limit_nano, r.committed_nano, r.retry_after_ms
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[],
			$10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[]) WITH ORDINALITY
			AS a(id, ledger_id, user_id, tenant, env, conversation, model, request_id, period, amount, estimate, now, expires, ord)
		CROSS JOIN LATERAL talkide_budget_reserve(a.id, a.ledger_id, a.user_id, a.tenant, a.env, a.conversation, a.model,
			a.request_id, a.period, a.amount, a.estimate, $14, a.now, a.expires, $15, $16, $17) r
		ORDER BY a.ord`,
		ids, ledgerIDs, users, tenants, envs, convs, models, reqIDs, periods, amounts, estimates, nows, expires,
		s.cfg.DefaultLimit, window, f.MaxRequests, f.MaxTokens)
	if err != nil {
		return fmt.Errorf("reserve budget: %w", err)
	}
	defer rows.Close()
	for i, o := range ops {
		r := o.reserve
		if !rows.Next() {
			if err := rows.Err(); err != nil {
				return fmt.Errorf("reserve budget: %w", err)
			}
			return fmt.Errorf("reserve budget: %d answers for %d reservations", i, n)
		}
		var retry int64
		if err := rows.Scan(&r.outcome, &r.limit, &r.committed, &retry); err != nil {
			return fmt.Errorf("reserve budget: %w", err)
		}
		r.retryAfter = time.Duration(retry) * time.Millisecond
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("reserve budget: %w", err)
	}
	return rows.Err()
}
