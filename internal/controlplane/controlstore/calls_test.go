package controlstore

import (
	"slices"
	"strings"
	"testing"
)

// testBookedCalls: the debits of a conversation's calls are found by
// request id, summed per call; ids of another conversation's calls, of
// reservations and of calls not booked yet are left out.
func testBookedCalls(t *testing.T, db *DB) {
	ctx := t.Context()
	ledger := func(kind, conv, req string, amount, in, out int64) {
		t.Helper()
		if _, err := db.SQL.ExecContext(ctx, db.Q(`INSERT INTO budget_ledger (id, created_at, kind, user_id, period, reservation_id,
			conversation_id, model, request_id, input_tokens, output_tokens, cache_write_5m, cache_write_1h, cache_read, amount_nano, outcome)
			VALUES (?, 1, ?, 'u1', '2026-12', 'r', ?, 'm1', ?, ?, ?, 1, 2, 3, ?, 'complete')`),
			kind+conv+req, kind, conv, req, in, out, amount); err != nil {
			t.Fatal(err)
		}
	}
	ledger("reserve", "c1", "req_a", 900, 0, 0)
	ledger("debit", "c1", "req_a", 300, 100, 20)
	ledger("debit", "c1", "req_b", 0, 0, 0)
	ledger("debit", "c2", "req_c", 700, 1, 1) // another conversation's
	got, err := db.BookedCalls(ctx, "c1", []string{"req_a", "req_b", "req_c", "req_not_yet"})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b BookedCall) int { return strings.Compare(a.RequestID, b.RequestID) })
	want := []BookedCall{
		{RequestID: "req_a", Model: "m1", Outcome: "complete", AmountNano: 300, InputTokens: 100, OutputTokens: 20, CacheWriteTokens: 3, CacheReadTokens: 3},
		{RequestID: "req_b", Model: "m1", Outcome: "complete", CacheWriteTokens: 3, CacheReadTokens: 3},
	}
	if !slices.Equal(got, want) {
		t.Errorf("booked calls:\n got %+v\nwant %+v", got, want)
	}
	if _, err := db.BookedCalls(ctx, "c1", make([]string, MaxBookedCallsQuery+1)); err == nil {
		t.Error("a query over the bound was answered")
	}
	if got, err := db.BookedCalls(ctx, "c1", nil); err != nil || len(got) != 0 {
		t.Errorf("no ids: got %v, %v", got, err)
	}
}
