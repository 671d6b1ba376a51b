// Package gateway is the control plane's gateway-proxy
// (/api/internal/gateway/anthropic/*): the one place that holds the Anthropic
// API key and the one place that spends money.
//
// For each call it validates the WorkerToken, resolves tenant, env,
// conversation and user from it, reserves the call's worst-case cost with the
// UserBudgetService (preCallCheck; a denial is a 429 that Anthropic clients do
// not retry), strips every client credential, adds the API key, forwards the
// request and streams the answer back byte for byte, flushed per write, while
// a tee reads the usage; when the answer ends it books the actual cost
// (postCallDebit) in the background, so the client never waits for the
// database. When the budget predicts that it admits the call, the call is
// forwarded while the reservation commits, and the upstream's answer is
// held until the reservation is durable (ticketTransport); a reservation
// refused after all cancels the upstream call, and the client gets the
// refusal. Errors use Anthropic's error envelope. Metrics (metrics.go) and
// the x-talkide-gateway-overhead-ms response header measure what it adds.
//
// Decisions (see also docs/gateway.md):
//   - Compression: the gateway asks the upstream for identity encoding. An
//     upstream that compresses anyway is passed through unchanged (the
//     client decodes it); gzip and deflate are decoded on the tee for
//     metering, any other coding is charged at the reservation.
//   - A stream that ends early (an error event after 200, an upstream cut
//     between events, a client that went away) is debited for what is
//     known: the input-side usage of message_start, and the larger of the
//     reported output and an estimate of the output delivered. A client
//     that goes away after message_start cancels the upstream call at once
//     instead of draining it: the user stopped the turn, and draining
//     would pay for output nobody reads.
//   - Usage that cannot be read books the reservation (outcome unmetered,
//     with a warning naming the call and why), never the figures read
//     before it: a final message_delta (or JSON answer) that is not JSON,
//     lacks usage or output_tokens, or holds a count of the wrong type or
//     below zero; a stream cut inside its message_delta; a stream that
//     ended (message_stop, or a clean end of the body) without one.
//   - Booking what may be billed (clientgone.go): the upstream call runs on
//     a context of its own, not the client's. A client that leaves before
//     the usage is known (a non-streaming call, or a stream before
//     message_start) does not end it: the gateway reads on, for at most
//     Config.ClientGoneWait, and books the usage the upstream reports. A
//     call the upstream took but whose usage never came (that wait ran
//     out, the upstream failed) is booked at its input-side worst case;
//     only a call that never reached the upstream is booked at zero.
//   - A budget smaller than one worst case (lower.go): a call refused for
//     its budget is admitted with max_tokens lowered to what the remaining
//     budget covers, when that is at least MinLoweredMaxTokens, and the
//     answer carries HeaderMaxTokensLowered.
//
// Files, one concern each: gateway.go (the Handler and its configuration),
// admit.go (the WorkerToken and the reservation), quote.go and decode.go
// (reading and pricing the request body), forward.go (the upstream
// transport), meter.go (the tee that reads usage, and booking), clientgone.go
// and lower.go (the decisions above), upstreamerr.go (why the upstream
// could not be reached), keyrefused.go (an API key the upstream refuses),
// namerequest.go (the request id in upstream errors), readiness.go
// (CheckUpstream) and metrics.go.
//
// Main type: Handler. It does not mint tokens (package mint) or store prices
// and budgets (package budget).
package gateway
