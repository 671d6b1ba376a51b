// Package budget is the UserBudgetService: it decides whether a user may
// make a model call (PreCallCheck, the specification's preCallCheck) and
// books what the call cost (PostCallDebit, postCallDebit), per user per
// period (a UTC calendar month by default), in nano-USD (NanoUSD: 10⁻⁹ US
// dollars, int64; no float ever touches money).
//
// Limits: a user's own limit, else their tenant's default, else the global
// default (limits.go). Fair use: at most N calls and M tokens per user in a
// rolling window, refused with a retry-after. PreCallCheck reserves the
// call's worst-case cost atomically with the limit check, so concurrent
// calls can never push admitted spend past the limit, also for a user never
// seen before; PostCallDebit replaces the reservation with the actual cost.
// A reservation never settled (the gateway died mid-call) is charged in full
// when it expires, so a debit is never lost; a late settlement corrects it.
// Every reservation, debit, expiry and refund is appended to a ledger that
// Ledger queries. Prices come from a dated PriceTable (price.go,
// default_prices.json; operators load their own file) keyed by the model the
// response names; worst cases include what server tools may add
// (servertool.go).
//
// # Files
//
//   - service.go: the API and its types (Service, Call, Reservation, Debit,
//     errors, Config).
//   - batch.go: write scheduling and batched commits. Reservations are
//     queued and committed by the first waiting caller that takes the
//     leader's token (lead: group commit without a goroutine hand-off);
//     settlements and expiries are committed by the writer goroutine, in
//     batches, settlements after up to SettleDelay.
//   - durability.go: the writer's connection (prepared statements) and
//     SQLite durability (WAL, synchronous=NORMAL, fsynced by the syncer
//     goroutine every WALSyncInterval). On SQLite that one connection carries
//     every budget write, used by whoever holds Service.conn: the writer
//     goroutine or a caller leading a batch of reservations.
//   - store.go: the SQL of each write (reserve, settle, expire) and the
//     ledger; on SQLite the reservation's check runs here in Go.
//   - postgres.go: reservation batches on PostgreSQL, one statement calling
//     the talkide_budget_reserve function (controlstore/pgsql, which locks
//     the user's usage row) once per reservation, on a pooled connection.
//   - pipeline.go: PreCallCheckAsync and the user views it predicts from.
//
// Two stores, one conformance suite (budget_test.go): SQLite and PostgreSQL.
//
// # Pipelined pre-call checks
//
// A durable reservation costs a database commit (about 0.3 ms on SQLite,
// 1 ms or more on PostgreSQL). PreCallCheckAsync, the gateway's path, takes
// that commit off the critical path when it can predict its outcome: it
// queues the reservation and returns at once with a Ticket saying
// "predicted", so the gateway forwards the call while the reservation
// commits (after CommitDelay, or at once when Ticket.Begin is called), and
// holds the upstream's answer until it has (the upstream's time to first
// byte is far longer). The database stays the only judge: when it refuses a
// predicted call after all (another replica spent the user's budget in
// between), the gateway cancels the upstream call and answers the refusal,
// and nothing is booked; the ledger never shows admitted spend past a limit.
//
// The prediction is made from a view of each active user kept in memory:
// the limit and committed spend (spent + reserved) of the last database
// answer, plus the calls admitted since then that the database has not
// answered yet. A call is predicted only with room to spare (its worst case
// fits twice into what is left), with fair-use counts (calls still
// committing included) under three quarters of their limits, and no refusal
// seen recently; anything else (a user near a limit, a view older than
// viewTTL, a call through another tenant than the view's, an error) takes
// the exact path and waits for the database before forwarding. A call of a
// user the service has no view of loads one with a read (no write, no
// lock). Reservations are queued in the order they were decided and the
// batch leader applies the answers in commit order, so a call this process
// predicted is never refused because of this process's later calls.
//
// What it trades: a call forwarded on a prediction is on its way upstream
// for a few milliseconds (CommitDelay plus the commit) before its
// reservation is on disk. Should the control plane die in that window, the
// call is cut with the process, and its reservation, with whatever the
// upstream billed for it, is not booked. Config.NoPrediction (the control
// plane's TALKIDE_BUDGET_PREDICT=off) forwards every call only after its
// reservation is durable, at the cost of that commit on every call.
//
// Main types: Service, Ticket, PriceTable, Price. This package does not
// parse HTTP or streams; the gateway-proxy does.
package budget
