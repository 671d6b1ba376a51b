// Package budget is the UserBudgetService: it decides whether a user may
// make a model call (PreCallCheck, the specification's preCallCheck) and
// books what the call cost (PostCallDebit, postCallDebit), per user per
// period (a UTC calendar month by default), in nano-USD (NanoUSD: 10⁻⁹ US
// dollars, int64; no float ever touches money).
//
// Limits: a user's own limit, else their tenant's default, else the global
// default. Fair use: at most N calls and M tokens per user in a rolling
// window, refused with a retry-after. PreCallCheck reserves the call's
// worst-case cost atomically with the limit check, so concurrent calls can
// never push admitted spend past the limit, also for a user never seen
// before; PostCallDebit replaces the reservation with the actual cost.
// A reservation never settled (the gateway died mid-call) is charged in full
// when it expires, so a debit is never lost; a late settlement corrects it.
// Every reservation, debit, expiry and refund is appended to a ledger that
// Ledger queries.
//
// PreCallCheckAsync, the gateway's path, predicts the outcome from an
// in-memory view of the user when it safely can and commits the reservation
// while the call is forwarded (pipeline.go); the database stays the judge.
//
// Two stores, one conformance suite (budget_test.go): SQLite, where budget
// writes are committed in batches on one writer connection, and PostgreSQL, where
// the check is a PL/pgSQL function that locks the user's usage row
// (controlstore/pgsql), called once per reservation of a batch. Prices come from a dated PriceTable (price.go,
// default_prices.json; operators load their own file) keyed by the model the
// response names.
//
// Main types: Service, PriceTable, Price. This package does not parse HTTP
// or streams; the gateway-proxy does.
package budget
