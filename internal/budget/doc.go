// Package budget is the UserBudgetService: it decides whether a user may
// make a model call (preCallCheck) and books what the call cost
// (postCallDebit), per user per calendar month, in nano-USD (10⁻⁹ US dollars,
// int64; no floats touch money).
//
// PreCallCheck reserves the call's worst-case cost atomically (one
// conditional UPDATE, so concurrent calls can never push admitted spend past
// the limit); PostCallDebit replaces the reservation with the actual cost.
// Unsettled reservations expire. Every reservation, debit and release is
// appended to a ledger. Prices come from a PriceTable keyed by the model the
// response names; an unknown model is priced at the dearest known rate.
//
// State lives in the control-plane database (package controlstore). This
// package does not parse HTTP or streams; the gateway-proxy does.
package budget
