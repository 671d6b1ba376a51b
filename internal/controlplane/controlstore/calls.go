package controlstore

import (
	"context"
	"fmt"
	"strings"
)

// BookedCall is what the gateway booked for one model call of a
// conversation (its debit in the budget ledger).
type BookedCall struct {
	// RequestID is the upstream's request id of the call (the gateway's
	// own when the upstream gave none).
	RequestID string
	Model     string
	// Outcome is how the call ended for the meter: complete, http_error,
	// client_disconnect, upstream_cut, unmetered, no_usage, ….
	Outcome string
	// AmountNano is the amount booked, in billionths of a US dollar.
	AmountNano int64
	// Tokens booked: input, output, cache writes (5-minute and 1-hour) and
	// cache reads.
	InputTokens, OutputTokens, CacheWriteTokens, CacheReadTokens int64
}

// MaxBookedCallsQuery bounds the request ids of one BookedCalls query.
const MaxBookedCallsQuery = 200

// BookedCalls returns the debits booked for conversation conv under the
// given request ids, in no particular order; an id with no debit (not
// booked yet, or not a call of conv) is left out. More than
// MaxBookedCallsQuery ids is an error.
func (db *DB) BookedCalls(ctx context.Context, conv string, requestIDs []string) ([]BookedCall, error) {
	if len(requestIDs) == 0 {
		return nil, nil
	}
	if len(requestIDs) > MaxBookedCallsQuery {
		return nil, fmt.Errorf("booked calls: %d request ids, at most %d", len(requestIDs), MaxBookedCallsQuery)
	}
	args := []any{conv}
	for _, id := range requestIDs {
		args = append(args, id)
	}
	rows, err := db.SQL.QueryContext(ctx, db.Q(`SELECT request_id, MAX(model), MAX(outcome), SUM(amount_nano), SUM(input_tokens),
		SUM(output_tokens), SUM(cache_write_5m + cache_write_1h), SUM(cache_read)
		FROM budget_ledger WHERE conversation_id = ? AND kind = 'debit' AND request_id IN (?`+strings.Repeat(", ?", len(requestIDs)-1)+`)
		GROUP BY request_id`), args...)
	if err != nil {
		return nil, fmt.Errorf("booked calls: %w", err)
	}
	defer rows.Close()
	var out []BookedCall
	for rows.Next() {
		var c BookedCall
		if err := rows.Scan(&c.RequestID, &c.Model, &c.Outcome, &c.AmountNano, &c.InputTokens, &c.OutputTokens, &c.CacheWriteTokens, &c.CacheReadTokens); err != nil {
			return nil, fmt.Errorf("booked calls: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("booked calls: %w", err)
	}
	return out, nil
}
