package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/token"
)

// Admission: a call is checked (its WorkerToken, its body) and priced,
// and its worst case reserved, before anything is forwarded.

// admit checks the call and reserves its budget. It returns the call to
// forward, or the refusal to answer, or neither when the client is gone.
// On success r's body is replaced by the bytes read.
func (h *Handler) admit(w http.ResponseWriter, r *http.Request, apiPath string, start time.Time) (*call, *refusal) {
	if !contract.GatewayForwards(apiPath) {
		return nil, refused("not_found", http.StatusNotFound, anthropic.ErrNotFound,
			"the gateway forwards only /v1/messages and /v1/messages/count_tokens")
	}
	if r.Method != http.MethodPost {
		ref := refused("method", http.StatusMethodNotAllowed, anthropic.ErrInvalidRequest, "method not allowed")
		ref.err.Header = http.Header{"Allow": {http.MethodPost}}
		return nil, ref
	}
	raw := r.Header.Get(contract.HeaderWorkerToken)
	if raw == "" {
		return nil, refused("auth", http.StatusUnauthorized, anthropic.ErrAuthentication, "missing X-Worker-Token")
	}
	claims, err := h.verifier.Verify(raw)
	if err != nil {
		// A warning, as at the mint and the worker (a forged or foreign
		// credential is worth an alert); the cause is on the error line.
		h.log.WarnContext(r.Context(), "gateway refused worker token", "token", token.Fingerprint(raw))
		ref := refused("auth", http.StatusUnauthorized, anthropic.ErrAuthentication, "invalid or expired worker token")
		ref.err.Err = err
		if errors.Is(err, token.ErrExpired) || errors.Is(err, token.ErrNotYetValid) {
			// Sending the same request again sends the same token: an
			// Anthropic SDK talking to the gateway directly must not
			// retry (x-should-retry: false) but mint a new token, which
			// details.error_code tells it (docs/direct-sdk.md). The
			// worker's local proxy mints per request, so it turns this
			// answer into a retry for the CLI (localproxy.retryExpired).
			ref.err.Msg = MsgTokenExpired
			ref.reason = "auth_expired"
			ref.err.Header = http.Header{"X-Should-Retry": {"false"}}
			ref.err.Details = map[string]any{"error_code": contract.ErrCodeTokenExpired}
		}
		return nil, ref
	}
	// A WorkerToken checks out: the id the worker's local proxy sent for
	// this model call names it here too.
	reqID := httpapi.AdoptRequestID(w, r)
	if claims.Conversation == "" || claims.User == "" {
		return nil, refused("forbidden", http.StatusForbidden, anthropic.ErrPermission, "worker token not scoped to a conversation")
	}
	tooLarge := refused("too_large", http.StatusRequestEntityTooLarge, anthropic.ErrTooLarge, "request body over 32 MB")
	if r.ContentLength > MaxRequestBytes {
		return nil, tooLarge
	}
	body, err := readBody(w, r)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge
		}
		if r.Context().Err() != nil {
			return nil, nil
		}
		// The cause (a cut connection, a broken chunked body) is for the log;
		// the client gets a message that names no internals.
		ref := refused("bad_request", http.StatusBadRequest, anthropic.ErrInvalidRequest, "the request body could not be read")
		ref.err.Err = err
		return nil, ref
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	c := &call{claims: claims, apiPath: apiPath, requestID: reqID, start: start, client: r.Context()}
	if apiPath != "/v1/messages" {
		return c, nil // count_tokens is free
	}
	q, ref := quoteBody(h.cfg.Prices, body, start)
	if ref != nil {
		return nil, ref
	}
	head, price, prompt, tools := q.head, q.price, q.prompt, q.tools
	c.model = head.Model
	c.floor = q.floor
	call := budget.Call{
		UserID: claims.User, Tenant: claims.Tenant, Env: claims.Env, ConversationID: claims.Conversation,
		Model: head.Model, RequestID: reqID, Amount: q.amount, EstimatedTokens: prompt,
	}
	t := h.cfg.Budget.PreCallCheckAsync(r.Context(), call)
	c.ticket = t
	if t.Predicted {
		return c, nil // forwarded while the reservation commits (ticketTransport)
	}
	res, err := t.Result()
	var deny *budget.DenyError
	if errors.As(err, &deny) {
		// The call's worst case does not fit: admit it with max_tokens
		// lowered to what the rest of the budget covers, if that is
		// enough to be of use (lower.go).
		if n, ok := lowerMaxTokens(price, prompt, head, tools, deny); ok {
			lowered, _ := head.WithMaxTokens(body, n)
			call.Amount = price.WorstCaseWithTools(prompt, n, tools)
			t2 := h.cfg.Budget.PreCallCheckAsync(r.Context(), call)
			res2, err2 := t2.Result() // after a refusal nothing is predicted; wait either way
			if err2 == nil {
				t, res, err = t2, res2, nil
				c.ticket, c.lowered = t2, n
				body = lowered
				r.Body = io.NopCloser(bytes.NewReader(body))
				r.ContentLength = int64(len(body))
				h.log.Info("gateway lowered max_tokens to fit the budget", "tenant", claims.Tenant, "conversation", claims.Conversation,
					"user", claims.User, "request_id", reqID, "max_tokens", head.MaxTokens, "lowered_to", n)
			} else if !errors.As(err2, &deny) {
				err = err2
			}
		}
	}
	if err != nil {
		if r.Context().Err() != nil {
			return nil, nil
		}
		return nil, h.budgetRefusal(err, claims)
	}
	c.res = res
	return c, nil
}

// budgetRefusal is the answer to a pre-call check that failed with err.
func (h *Handler) budgetRefusal(err error, claims *token.Claims) *refusal {
	var deny *budget.DenyError
	var fair *budget.FairUseError
	switch {
	case errors.As(err, &deny):
		// Not retryable now (x-should-retry: false, which Anthropic's SDKs
		// obey over the status), but retry-after says when the period
		// resets, so a client need not read details to tell it from a
		// transient rate limit (docs/gateway-money.md, "Refusals").
		ref := refused("budget", http.StatusTooManyRequests, anthropic.ErrRateLimit,
			fmt.Sprintf(MsgBudgetExhausted+" your spending limit for %s is $%s, $%s of it is used or held by calls in progress, and this call could cost up to $%s. It resets at %s; ask your administrator to raise the limit.",
				deny.Period, budget.FormatUSD(deny.Limit), budget.FormatUSD(deny.Committed), budget.FormatUSD(deny.Needed), deny.Resets.UTC().Format(time.RFC3339)))
		ref.err.Err = fmt.Errorf("tenant %s env %s conversation %s: %w", claims.Tenant, claims.Env, claims.Conversation, err)
		ref.err.Header = http.Header{"X-Should-Retry": {"false"}, "Retry-After": {strconv.FormatInt(secondsUntil(deny.Resets), 10)}}
		ref.err.Details = map[string]any{"error_code": contract.ErrCodeBudgetExceeded, "period": deny.Period,
			"resets_at": deny.Resets.UTC().Format(time.RFC3339)}
		return ref
	case errors.As(err, &fair):
		secs := int64((fair.RetryAfter + time.Second - 1) / time.Second)
		ref := refused("fair_use_"+fair.Limit, http.StatusTooManyRequests, anthropic.ErrRateLimit,
			fmt.Sprintf("TalkIDE fair-use limit: too many %s in a short time; try again in %d s.", fair.Limit, secs))
		ref.err.Err = err
		ref.err.Header = http.Header{"Retry-After": {strconv.FormatInt(secs, 10)}}
		ref.err.Details = map[string]any{"error_code": contract.ErrCodeFairUse, "limit": fair.Limit}
		return ref
	}
	ref := refused("budget_error", http.StatusServiceUnavailable, anthropic.ErrAPI, "budget service unavailable")
	ref.err.Err = fmt.Errorf("user %s: %w", claims.User, err)
	return ref
}

// secondsUntil is the whole seconds from now until t, rounded up, at least 1.
func secondsUntil(t time.Time) int64 {
	return max(1, int64((time.Until(t)+time.Second-1)/time.Second))
}

// readBody reads the request body, at most MaxRequestBytes, into one buffer
// sized by Content-Length when the client sent one.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, MaxRequestBytes)
	if n := r.ContentLength; n > 0 && n <= MaxRequestBytes {
		buf := make([]byte, n)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil, err
		}
		// Content-Length is the whole body; a longer one is the
		// server's concern (it refuses it before we read).
		return buf, nil
	}
	return io.ReadAll(rd)
}
