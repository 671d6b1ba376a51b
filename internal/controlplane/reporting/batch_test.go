package reporting

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/pgtest"
)

func TestReportBatchSQLite(t *testing.T) {
	s := newTestServer(t)
	testReportBatch(t, s)
	testOneBadReportHoldsBackOnlyItself(t, s)
}

func TestReportBatchPostgres(t *testing.T) {
	db, err := controlstore.OpenPostgres(t.Context(), pgtest.SchemaURL(t), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s := newTestServerOn(t, NewStore(db))
	testReportBatch(t, s)
	testOneBadReportHoldsBackOnlyItself(t, s)
}

// testOneBadReportHoldsBackOnlyItself: a report the database refuses (here
// a trigger refuses one summary) fails the batch's transaction; the others
// are then stored one by one and only it is answered 500, to be sent again.
func testOneBadReportHoldsBackOnlyItself(t *testing.T, s *testServer) {
	db := s.store.db
	poison := []string{`CREATE TRIGGER poison BEFORE INSERT ON activity_log WHEN NEW.summary = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned'); END`}
	if db.Dialect == controlstore.Postgres {
		poison = []string{`CREATE FUNCTION poison() RETURNS trigger AS $$ BEGIN IF NEW.summary = 'poison' THEN RAISE EXCEPTION 'poisoned'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql`,
			`CREATE TRIGGER poison BEFORE INSERT ON activity_log FOR EACH ROW EXECUTE FUNCTION poison()`}
	}
	for _, q := range poison {
		if _, err := db.SQL.ExecContext(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	c5, c6 := s.workerToken(t, "demo", "dev", "c5"), s.workerToken(t, "demo", "dev", "c6")
	b := contract.ReportBatch{Groups: []contract.ReportGroup{
		{WorkerToken: c5, Reports: []contract.BatchedReport{
			{Kind: contract.ReportKindActivity, Report: activityJSON("c5", 1, "fine")},
			{Kind: contract.ReportKindActivity, Report: activityJSON("c5", 2, "poison")},
			{Kind: contract.ReportKindActivity, Report: activityJSON("c5", 3, "fine again")},
		}},
		{WorkerToken: c6, Reports: []contract.BatchedReport{{Kind: contract.ReportKindActivity, Report: activityJSON("c6", 1, "fine")}}},
	}}
	for try := range 2 {
		st, ack, raw := s.batch(t, c5, b)
		if st != 200 || len(ack.Groups) != 2 || len(ack.Groups[0].Results) != 3 {
			t.Fatalf("try %d: %d %s", try, st, raw)
		}
		r := ack.Groups[0].Results
		if r[0].Status != 200 || r[1].Status != http.StatusInternalServerError || r[1].Error == nil || r[2].Status != 200 || ack.Groups[1].Results[0].Status != 200 {
			t.Fatalf("try %d: %s", try, raw)
		}
		if try == 1 && (!r[0].Duplicate || !r[2].Duplicate) {
			t.Errorf("the stored reports sent again were not duplicates: %s", raw)
		}
	}
	a5, _ := s.store.Activity(t.Context(), "c5", 0, 0)
	a6, _ := s.store.Activity(t.Context(), "c6", 0, 0)
	if len(a5.Activity) != 2 || len(a6.Activity) != 1 {
		t.Errorf("stored: c5 %+v, c6 %+v", a5.Activity, a6.Activity)
	}
}

func activityJSON(conv string, id int64, summary string) json.RawMessage {
	b, _ := json.Marshal(contract.ActivityReport{IdempotencyKey: fmt.Sprintf("%s:%d:activity", conv, id), EventID: id,
		Time: time.Now().UTC(), Type: contract.EventAssistantText, Summary: summary})
	return b
}

// batch sends b with X-Worker-Token tok.
func (s *testServer) batch(t *testing.T, tok string, b contract.ReportBatch) (int, contract.ReportBatchAck, string) {
	t.Helper()
	body, _ := json.Marshal(b)
	st, raw := s.do(t, tok, "POST", contract.PathReportBatch, string(body))
	var ack contract.ReportBatchAck
	if st == http.StatusOK {
		if err := json.Unmarshal(raw, &ack); err != nil {
			t.Fatalf("answer %s: %v", raw, err)
		}
	}
	return st, ack, string(raw)
}

// testReportBatch: one request stores several conversations' reports, each
// under its own group's token; a forged token, a token of another
// tenant-env than the request's, an invalid report or a reused key refuses
// only itself; sending the batch again stores nothing twice; and a report
// sent alone before is the same report in a batch.
func testReportBatch(t *testing.T, s *testServer) {
	c1, c2 := s.workerToken(t, "demo", "dev", "c1"), s.workerToken(t, "demo", "dev", "c2")
	prod := s.workerToken(t, "demo", "prod", "c8")
	forged := c1[:len(c1)-4] + "AAAA"
	// c1's first event went alone, before batches.
	single := activityJSON("c1", 1, "one")
	if st, b := s.do(t, c1, "POST", contract.PathReportActivity, string(single)); st != 200 {
		t.Fatalf("single report: %d %s", st, b)
	}
	usage, _ := json.Marshal(contract.UsageReport{IdempotencyKey: "c2:2:usage", EventID: 2, Time: time.Now().UTC(),
		Outcome: contract.OutcomeCompleted, Usage: contract.Usage{InputTokens: 10, OutputTokens: 3}})
	tool, _ := json.Marshal(contract.ToolEventReport{IdempotencyKey: "c2:1:tool", EventID: 1, Time: time.Now().UTC(),
		Phase: contract.ToolPhaseUse, ToolUseID: "t1", Name: "Bash", Input: json.RawMessage(`{"command":"ls"}`)})
	b := contract.ReportBatch{Groups: []contract.ReportGroup{
		{WorkerToken: c1, Reports: []contract.BatchedReport{
			{Kind: contract.ReportKindActivity, Report: single},
			{Kind: contract.ReportKindActivity, Report: activityJSON("c1", 2, "two")},
			{Kind: contract.ReportKindActivity, Report: json.RawMessage(`{"idempotency_key":"c1:3:activity","event_id":0}`)},
			{Kind: "gossip", Report: activityJSON("c1", 4, "four")},
			{Kind: contract.ReportKindActivity, Report: activityJSON("c1", 2, "two, told otherwise")},
		}},
		{WorkerToken: forged, Reports: []contract.BatchedReport{{Kind: contract.ReportKindActivity, Report: activityJSON("c9", 1, "forged")}}},
		{WorkerToken: c2, Reports: []contract.BatchedReport{
			{Kind: contract.ReportKindToolEvent, Report: tool},
			{Kind: contract.ReportKindUsage, Report: usage},
			{Kind: contract.ReportKindActivity, Report: activityJSON("c2", 2, "done")},
		}},
		{WorkerToken: prod, Reports: []contract.BatchedReport{{Kind: contract.ReportKindActivity, Report: activityJSON("c8", 1, "another tenant-env")}}},
	}}
	statuses := func(ack contract.ReportBatchAck) string {
		var out string
		for _, g := range ack.Groups {
			out += fmt.Sprintf("[%d", g.Status)
			for _, r := range g.Results {
				out += fmt.Sprintf(" %d", r.Status)
				if r.Duplicate {
					out += "d"
				}
			}
			out += "]"
		}
		return out
	}
	// Without a WorkerToken of its own, or with a forged one, the request
	// is refused before its body is read.
	for _, tok := range []string{"", forged} {
		if st, _, raw := s.batch(t, tok, b); st != http.StatusUnauthorized {
			t.Errorf("request token %q: %d %s, want 401", tok, st, raw)
		}
	}
	st, ack, raw := s.batch(t, c1, b)
	if got, want := statuses(ack), "[200 200d 200 400 400 409][401][200 200 200 200][403]"; st != 200 || got != want {
		t.Fatalf("first batch: %d %s\n got %s\nwant %s", st, raw, got, want)
	}
	st, ack, raw = s.batch(t, c2, b)
	if got, want := statuses(ack), "[200 200d 200d 400 400 409][401][200 200d 200d 200d][403]"; st != 200 || got != want {
		t.Fatalf("the batch again: %d %s\n got %s\nwant %s", st, raw, got, want)
	}
	// Text PostgreSQL cannot store (a NUL) is refused once, not failed on
	// every try.
	nul := contract.ReportBatch{Groups: []contract.ReportGroup{{WorkerToken: c1, Reports: []contract.BatchedReport{
		{Kind: contract.ReportKindActivity, Report: activityJSON("c1", 7, "nul \x00 here")}}}}}
	if st, ack, raw := s.batch(t, c1, nul); st != 200 || statuses(ack) != "[200 400]" {
		t.Errorf("a NUL in a summary: %d %s, want the report refused with 400", st, raw)
	}
	a1, _ := s.store.Activity(t.Context(), "c1", 0, 0)
	a2, _ := s.store.Activity(t.Context(), "c2", 0, 0)
	a9, _ := s.store.Activity(t.Context(), "c9", 0, 0)
	a8, _ := s.store.Activity(t.Context(), "c8", 0, 0)
	if len(a1.Activity) != 2 || a1.Activity[1].Summary != "two" || len(a2.Activity) != 1 || len(a2.ToolCalls) != 1 || len(a2.Turns) != 1 || len(a9.Activity) != 0 || len(a8.Activity) != 0 {
		t.Errorf("stored: c1 %+v\nc2 %+v\nc9 %+v\nc8 %+v", a1, a2, a9, a8)
	}
	if len(a2.Turns) == 1 && a2.Turns[0].Usage.InputTokens != 10 {
		t.Errorf("c2's turn: %+v", a2.Turns[0])
	}
	// Malformed and oversized batches are refused whole, with the JSON error shape.
	for name, body := range map[string]string{
		"not JSON":  `{"groups":`,
		"no groups": `{"groups":[]}`,
		"unknown":   `{"groups":[],"tenant":"other"}`,
	} {
		if st, raw := s.do(t, c1, "POST", contract.PathReportBatch, body); st != http.StatusBadRequest || !json.Valid([]byte(raw)) {
			t.Errorf("%s: %d %s, want 400 with an error body", name, st, raw)
		}
	}
	many := contract.ReportBatch{}
	for range contract.MaxReportBatchGroups + 1 {
		many.Groups = append(many.Groups, contract.ReportGroup{WorkerToken: c1})
	}
	if st, _, raw := s.batch(t, c1, many); st != http.StatusBadRequest {
		t.Errorf("%d groups: %d %s, want 400", len(many.Groups), st, raw)
	}
}

// TestRefusedBatchTakesNoWriteLock: a batch whose groups are all refused
// stores nothing, so it must not wait for the database's write lock: it was
// opening a write transaction with nothing to write, behind every other
// writer of the control plane. Here another connection holds the lock for
// the whole request.
func TestRefusedBatchTakesNoWriteLock(t *testing.T) {
	s := newTestServer(t)
	conn, err := s.store.db.SQL.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(t.Context(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(context.Background(), "ROLLBACK")
	c1 := s.workerToken(t, "demo", "dev", "c1")
	b := contract.ReportBatch{Groups: []contract.ReportGroup{{WorkerToken: c1[:len(c1)-4] + "AAAA",
		Reports: []contract.BatchedReport{{Kind: contract.ReportKindActivity, Report: activityJSON("c1", 1, "x")}}}}}
	type answer struct {
		st  int
		ack contract.ReportBatchAck
		raw string
	}
	done := make(chan answer, 1)
	go func() {
		st, ack, raw := s.batch(t, c1, b)
		done <- answer{st, ack, raw}
	}()
	// SQLite would give up on the lock after its busy timeout (10 s) and
	// answer all the same: the request must be answered well before, with
	// the lock still held.
	select {
	case a := <-done:
		if a.st != http.StatusOK || len(a.ack.Groups) != 1 || a.ack.Groups[0].Status != http.StatusUnauthorized {
			t.Fatalf("%d %s, want 200 with the group refused 401", a.st, a.raw)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a batch with nothing to store waited for the database's write lock")
	}
}
