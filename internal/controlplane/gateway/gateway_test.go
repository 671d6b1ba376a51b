package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/go-cmp/cmp"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/gateway"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
)

// scriptedUsage is the usage the upstream reports in the tests that book a
// call; it exercises every ledger column.
func scriptedUsage() *devupstream.Usage {
	return &devupstream.Usage{
		InputTokens:              1200,
		CacheCreationInputTokens: 200,
		CacheCreation:            &devupstream.CacheCreation{Ephemeral5mInputTokens: 120, Ephemeral1hInputTokens: 80},
		CacheReadInputTokens:     300,
		OutputTokens:             42,
	}
}

// The headers a client sends that must never reach the upstream, with
// the client credential values.
var clientCredentials = http.Header{
	"Authorization":       {"Bearer talkide-local-placeholder"},
	"X-Api-Key":           {"sk-client-must-not-pass"},
	"Cookie":              {"session=browser-secret"},
	"Proxy-Authorization": {"Basic dXNlcjpwYXNz"},
	"X-Forwarded-For":     {"10.1.2.3"},
}

func TestGatewayForwardsByteForByteAndBooksUsage(t *testing.T) {
	for _, stream := range []bool{true, false} {
		name := "json"
		if stream {
			name = "stream"
		}
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.up.Script(devupstream.Response{
				Content: []devupstream.ContentBlock{devupstream.Text("Hello from the upstream, <b>unchanged</b> — ünïcödé.")},
				Usage:   scriptedUsage(),
			})
			body := messagesBody(stream, 1024)
			tok := f.workerToken(t, convID, userID)
			req := f.request(t.Context(), t, http.MethodPost, "/v1/messages?beta=true", tok, strings.NewReader(body))
			for k, vs := range clientCredentials {
				req.Header[k] = vs
			}
			const beta = "interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14"
			req.Header.Set("anthropic-beta", beta)
			req.Header.Set("anthropic-version", "2023-06-01")
			got := do(t, req)

			if got.status != http.StatusOK {
				t.Fatalf("status: got %d (%s), want 200", got.status, got.body)
			}
			answers := f.rec.answered()
			if len(answers) != 1 {
				t.Fatalf("upstream answers: got %d, want 1", len(answers))
			}
			up := answers[0]
			if !bytes.Equal(got.body, up.body) {
				t.Errorf("client bytes differ from upstream bytes (-upstream +client):\n%s", cmp.Diff(string(up.body), string(got.body)))
			}
			if stream && !bytes.Contains(got.body, []byte("event: message_stop")) {
				t.Errorf("stream: got %q, want a complete SSE stream", got.body)
			}
			// Every header the upstream set reaches the client unchanged:
			// request-id, anthropic-*, content type.
			for k, want := range up.header {
				if diff := cmp.Diff(want, got.header.Values(k)); diff != "" {
					t.Errorf("response header %s (-upstream +client):\n%s", k, diff)
				}
			}
			for _, k := range []string{"Request-Id", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Organization-Id"} {
				if got.header.Get(k) == "" {
					t.Errorf("response header %s: got none, want it passed through", k)
				}
			}

			recs := f.up.Requests()
			if len(recs) != 1 {
				t.Fatalf("upstream requests: got %d, want 1", len(recs))
			}
			ur := recs[0]
			if ur.Method != http.MethodPost || ur.Path != "/v1/messages" || ur.Query != "beta=true" {
				t.Errorf("upstream request: got %s %s?%s, want POST /v1/messages?beta=true", ur.Method, ur.Path, ur.Query)
			}
			if diff := cmp.Diff([]string{upstreamKey}, ur.Header.Values("X-Api-Key")); diff != "" {
				t.Errorf("upstream x-api-key (-want +got):\n%s", diff)
			}
			for _, k := range []string{"Authorization", "Cookie", "Proxy-Authorization", contract.HeaderWorkerToken, "X-Forwarded-For"} {
				if v := ur.Header.Values(k); len(v) != 0 {
					t.Errorf("upstream header %s: got %q, want none", k, v)
				}
			}
			if got, want := ur.Header.Get("anthropic-version"), "2023-06-01"; got != want {
				t.Errorf("upstream anthropic-version: got %q, want %q", got, want)
			}
			if got := ur.Header.Get("anthropic-beta"); got != beta {
				t.Errorf("upstream anthropic-beta: got %q, want %q", got, beta)
			}
			if string(ur.Body) != body {
				t.Errorf("upstream body: got %q, want %q", ur.Body, body)
			}

			ledger := f.waitSettled(t, userID, 1)
			if len(ledger) != 2 || ledger[0].Kind != "reserve" || ledger[0].Amount <= 0 {
				t.Fatalf("ledger: got %+v, want one positive reserve and one debit", ledger)
			}
			wantUsage := anthropic.Usage{
				Model: model, InputTokens: 1200, OutputTokens: 42, CacheCreationInputTokens: 200,
				CacheCreation5m: 120, CacheCreation1h: 80, CacheReadInputTokens: 300,
			}
			cost := costOf(wantUsage)
			want := ledgerRow{
				Kind: "debit", ReservationID: ledger[0].ReservationID, ConversationID: convID, Model: model,
				RequestID: up.header.Get("Request-Id"), InputTokens: 1200, OutputTokens: 42,
				CacheWrite5m: 120, CacheWrite1h: 80, CacheRead: 300, Amount: cost, Outcome: "complete",
			}
			if diff := cmp.Diff(want, ledger[1]); diff != "" {
				t.Errorf("debit (-want +got):\n%s", diff)
			}
			sp := f.spend(t, userID)
			if sp.Spent != cost || sp.Reserved != 0 {
				t.Errorf("spend: got spent %d reserved %d, want spent %d reserved 0", sp.Spent, sp.Reserved, cost)
			}
			if logs := f.logs.String(); strings.Contains(logs, tok) || strings.Contains(logs, upstreamKey) || strings.Contains(logs, "browser-secret") {
				t.Errorf("log contains a credential:\n%s", logs)
			}
		})
	}
}

func TestGatewayCountTokensForwardedWithoutReservation(t *testing.T) {
	f := newFixture(t)
	req := f.request(t.Context(), t, http.MethodPost, "/v1/messages/count_tokens", f.workerToken(t, convID, userID),
		strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"count me"}]}`))
	req.Header.Set("Authorization", "Bearer placeholder")
	got := do(t, req)
	if got.status != http.StatusOK || !bytes.Contains(got.body, []byte(`"input_tokens"`)) {
		t.Fatalf("count_tokens: got %d %s, want 200 with input_tokens", got.status, got.body)
	}
	recs := f.up.Requests()
	if len(recs) != 1 || recs[0].Path != "/v1/messages/count_tokens" || recs[0].Header.Get("X-Api-Key") != upstreamKey ||
		recs[0].Header.Get("Authorization") != "" || recs[0].Header.Get(contract.HeaderWorkerToken) != "" {
		t.Errorf("upstream requests: got %+v, want one count_tokens call with only the gateway's key", recs)
	}
	if l := f.ledger(t, userID); len(l) != 0 {
		t.Errorf("ledger: got %+v, want nothing booked for count_tokens", l)
	}
}

func TestGatewayRefusesBadWorkerTokens(t *testing.T) {
	f := newFixture(t)
	gwKey := f.master.Derive(token.PurposeGateway, "", "")
	workerKey := f.master.Derive(token.PurposeWorkerRequest, tenant, env) // the key a demo/dev worker holds
	sign := func(p token.Purpose, k token.Key, c token.Claims, ttl time.Duration) string {
		tok, err := token.NewSigner(p, k).Sign(c, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	scoped := token.Claims{Tenant: tenant, Env: env, Conversation: convID, User: userID}
	other, err := token.NewMasterKey(f.master.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Gateway claims, hand-built and signed with the worker's own key.
	forgedClaims := scoped
	forgedClaims.ID = token.NewID()
	forgedClaims.Purpose = token.PurposeGateway
	forgedClaims.Issuer = token.Issuer
	forgedClaims.Subject = token.Subject(tenant, env)
	forgedClaims.Audience = jwt.ClaimStrings{token.Audience(token.PurposeGateway, tenant, env)}
	forgedClaims.NotBefore = jwt.NewNumericDate(time.Now().Add(-time.Minute))
	forgedClaims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(time.Minute))
	fj := jwt.NewWithClaims(jwt.SigningMethodHS256, forgedClaims)
	fj.Header["kid"] = workerKey.ID
	forged, err := fj.SignedString(workerKey.Secret)
	if err != nil {
		t.Fatal(err)
	}
	nj := jwt.NewWithClaims(jwt.SigningMethodNone, forgedClaims)
	nj.Header["kid"] = gwKey.ID
	algNone, err := nj.SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name   string
		tok    string
		status int
		typ    string
	}{
		{"no token", "", http.StatusUnauthorized, anthropic.ErrAuthentication},
		{"garbage", "garbage.token.value", http.StatusUnauthorized, anthropic.ErrAuthentication},
		{"forged with the worker's request key", forged, http.StatusUnauthorized, anthropic.ErrAuthentication},
		{"alg none", algNone, http.StatusUnauthorized, anthropic.ErrAuthentication},
		{"other master key", sign(token.PurposeGateway, other.Derive(token.PurposeGateway, "", ""), scoped, time.Minute), http.StatusUnauthorized, anthropic.ErrAuthentication},
		{"expired", sign(token.PurposeGateway, gwKey, scoped, -time.Minute), http.StatusUnauthorized, anthropic.ErrAuthentication},
		{"identity token", sign(token.PurposeIdentity, f.master.Derive(token.PurposeIdentity, "", ""), token.Claims{Tenant: tenant, Env: env}, time.Hour), http.StatusUnauthorized, anthropic.ErrAuthentication},
		{"request token", sign(token.PurposeWorkerRequest, workerKey, token.RequestClaims(tenant, env, http.MethodPost, contract.PathGatewayPrefix+"/v1/messages", []byte(messagesBody(false, 16))), time.Minute), http.StatusUnauthorized, anthropic.ErrAuthentication},
		{"no conversation", sign(token.PurposeGateway, gwKey, token.Claims{Tenant: tenant, Env: env, User: userID}, time.Minute), http.StatusForbidden, anthropic.ErrPermission},
		{"no user", sign(token.PurposeGateway, gwKey, token.Claims{Tenant: tenant, Env: env, Conversation: convID}, time.Minute), http.StatusForbidden, anthropic.ErrPermission},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := f.request(t.Context(), t, http.MethodPost, "/v1/messages", tc.tok, strings.NewReader(messagesBody(false, 16)))
			got := do(t, req)
			checkEnvelope(t, got, tc.status, tc.typ)
			if tc.tok != "" && strings.Contains(string(got.body), tc.tok) {
				t.Errorf("error body contains the token: %s", got.body)
			}
		})
	}
	if n := f.rec.arrivals.Load(); n != 0 {
		t.Errorf("upstream: got %d requests, want none", n)
	}
	if l := f.ledger(t, userID); len(l) != 0 {
		t.Errorf("ledger: got %+v, want empty", l)
	}
	logs := f.logs.String()
	for _, tc := range cases {
		if tc.tok != "" && strings.Contains(logs, tc.tok) {
			t.Errorf("log contains the token of case %q", tc.name)
		}
	}
}

func TestGatewayRefusesOtherPathsAndMethods(t *testing.T) {
	f := newFixture(t)
	tok := f.workerToken(t, convID, userID)
	cases := []struct {
		method, path string
		status       int
		typ          string
	}{
		{http.MethodGet, "/v1/models", http.StatusNotFound, anthropic.ErrNotFound},
		{http.MethodPost, "/v1/models", http.StatusNotFound, anthropic.ErrNotFound},
		{http.MethodPost, "/v1/files", http.StatusNotFound, anthropic.ErrNotFound},
		{http.MethodPost, "/v1/messages/batches", http.StatusNotFound, anthropic.ErrNotFound},
		{http.MethodPost, "/v1/complete", http.StatusNotFound, anthropic.ErrNotFound},
		{http.MethodPost, "/v1/messages/", http.StatusNotFound, anthropic.ErrNotFound},
		{http.MethodPost, "", http.StatusNotFound, anthropic.ErrNotFound},
		{http.MethodPost, "/v1/messages/../../v1/files", http.StatusNotFound, anthropic.ErrNotFound},
		{http.MethodGet, "/v1/messages", http.StatusMethodNotAllowed, anthropic.ErrInvalidRequest},
		{http.MethodPut, "/v1/messages", http.StatusMethodNotAllowed, anthropic.ErrInvalidRequest},
		{http.MethodDelete, "/v1/messages/count_tokens", http.StatusMethodNotAllowed, anthropic.ErrInvalidRequest},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			var body io.Reader
			if tc.method != http.MethodGet {
				body = strings.NewReader(messagesBody(false, 16))
			}
			got := do(t, f.request(t.Context(), t, tc.method, tc.path, tok, body))
			checkEnvelope(t, got, tc.status, tc.typ)
			if tc.status == http.StatusMethodNotAllowed && got.header.Get("Allow") != http.MethodPost {
				t.Errorf("Allow: got %q, want POST (RFC 9110 §15.5.6)", got.header.Get("Allow"))
			}
		})
	}
	if n := f.rec.arrivals.Load(); n != 0 {
		t.Errorf("upstream: got %d requests, want none", n)
	}
}

// as is an endless stream of 'a', to send big bodies without building
// them in memory.
type as struct{}

var aBlock = bytes.Repeat([]byte("a"), 32<<10)

func (as) Read(p []byte) (int, error) { return copy(p, aBlock), nil }

func TestGatewayRejectsBodyOver32MB(t *testing.T) {
	f := newFixture(t)
	head := `{"model":"` + model + `","max_tokens":16,"messages":[{"role":"user","content":"`
	tail := `"}]}`
	size := int64(gateway.MaxRequestBytes + 1)
	body := io.MultiReader(strings.NewReader(head), io.LimitReader(as{}, size-int64(len(head)+len(tail))), strings.NewReader(tail))
	req := f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), body)
	req.ContentLength = size
	// Reading 32 MB under the race detector is slow mostly because the
	// collector keeps trying to preempt the goroutine inside long
	// instrumented copies; a pause of the collector keeps this test fast.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	got := do(t, req)
	checkEnvelope(t, got, http.StatusRequestEntityTooLarge, anthropic.ErrTooLarge)
	if n := f.rec.arrivals.Load(); n != 0 {
		t.Errorf("upstream: got %d requests, want none", n)
	}
	if l := f.ledger(t, userID); len(l) != 0 {
		t.Errorf("ledger: got %+v, want empty", l)
	}
}

func TestGatewayBudgetDenyIsFinalAndNeverForwarded(t *testing.T) {
	f := newFixture(t)
	if err := f.budget.SetUserLimit(t.Context(), userID, 1000); err != nil { // 1 µUSD: below any call's worst case
		t.Fatal(err)
	}
	got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(messagesBody(true, 1024))))
	env := checkEnvelope(t, got, http.StatusTooManyRequests, anthropic.ErrRateLimit)
	if v := got.header.Get("x-should-retry"); v != "false" {
		t.Errorf("x-should-retry: got %q, want \"false\"", v)
	}
	// retry-after is the time until the period (a month by default) resets.
	resets := budget.Monthly.End(time.Now())
	if v, err := strconv.ParseInt(got.header.Get("retry-after"), 10, 64); err != nil || v < 1 || time.Duration(v)*time.Second > time.Until(resets)+time.Minute {
		t.Errorf("retry-after: got %q, want the seconds until %s", got.header.Get("retry-after"), resets)
	}
	if !strings.HasPrefix(env.Error.Message, gateway.MsgBudgetExhausted) {
		t.Errorf("message: got %q, want it to start with %q", env.Error.Message, gateway.MsgBudgetExhausted)
	}
	if code := env.Error.Details["error_code"]; code != "budget_exceeded" {
		t.Errorf("error.details.error_code: got %v, want budget_exceeded", code)
	}
	if at := env.Error.Details["resets_at"]; at != resets.Format(time.RFC3339) {
		t.Errorf("error.details.resets_at: got %v, want %s", at, resets.Format(time.RFC3339))
	}
	if n := f.rec.arrivals.Load(); n != 0 {
		t.Errorf("upstream: got %d requests, want none", n)
	}
	if l := f.ledger(t, userID); len(l) != 0 {
		t.Errorf("ledger: got %+v, want empty", l)
	}
	if sp := f.spend(t, userID); sp.Spent != 0 || sp.Reserved != 0 {
		t.Errorf("spend: got spent %d reserved %d, want 0 and 0", sp.Spent, sp.Reserved)
	}
}

// TestGatewayPassesUpstreamErrorsThroughAndReleases: an upstream error
// reaches the client as the upstream sent it (status, headers, body), its
// message named with the call's request id, and releases the reservation.
func TestGatewayPassesUpstreamErrorsThroughAndReleases(t *testing.T) {
	cases := []struct {
		name string
		err  devupstream.APIError
	}{
		{"overloaded 529", devupstream.APIError{Status: 529, Type: "overloaded_error", Message: "Overloaded", Header: map[string]string{"retry-after": "3"}}},
		{"rate limited 429", devupstream.APIError{Status: 429, Type: "rate_limit_error", Message: "slow down", Header: map[string]string{
			"retry-after": "7", "anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "2026-11-30T12:00:07Z",
		}}},
		{"api error 500", devupstream.APIError{Status: 500, Type: "api_error", Message: "Internal server error"}},
		{"spend limit 400", devupstream.APIError{Status: 400, Type: "invalid_request_error", Message: "workspace spend limit", Details: []byte(`{"error_code":"enforced_spend_limit_reached"}`)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			e := tc.err
			f.up.Script(devupstream.Response{Error: &e})
			got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(messagesBody(true, 1024))))
			answers := f.rec.answered()
			if len(answers) != 1 {
				t.Fatalf("upstream answers: got %d, want 1", len(answers))
			}
			up := answers[0]
			if got.status != tc.err.Status || got.status != up.status {
				t.Errorf("status: got %d, want %d", got.status, tc.err.Status)
			}
			// The body is the upstream's, byte for byte, but for the
			// gateway's request id at the end of the message (which is
			// all Claude Code shows of it).
			named := regexp.MustCompile(`"message":"` + regexp.QuoteMeta(tc.err.Message) + ` \(request (req_gw_[0-9a-f]{20})\)"`)
			id := named.FindSubmatch(got.body)
			if id == nil || !bytes.Equal(bytes.Replace(got.body, []byte(" (request "+string(id[1])+")"), nil, 1), up.body) {
				t.Errorf("body (-upstream +client):\n%s", cmp.Diff(string(up.body), string(got.body)))
			}
			for k, want := range up.header {
				if k == "Content-Length" {
					continue
				}
				if diff := cmp.Diff(want, got.header.Values(k)); diff != "" {
					t.Errorf("header %s (-upstream +client):\n%s", k, diff)
				}
			}
			if ra := tc.err.Header["retry-after"]; ra != "" && got.header.Get("retry-after") != ra {
				t.Errorf("retry-after: got %q, want %q", got.header.Get("retry-after"), ra)
			}
			ledger := f.waitSettled(t, userID, 1)
			if len(ledger) != 2 || ledger[1].Kind != "debit" || ledger[1].Amount != 0 {
				t.Errorf("ledger: got %+v, want a reserve and a debit of 0", ledger)
			}
			if sp := f.spend(t, userID); sp.Spent != 0 || sp.Reserved != 0 {
				t.Errorf("spend: got spent %d reserved %d, want 0 and 0", sp.Spent, sp.Reserved)
			}
		})
	}
}

// startUsage is the usage billed when a stream ends after message_start:
// its input counts and the 1 output token message_start reports.
func startUsage() anthropic.Usage {
	return anthropic.Usage{Model: model, InputTokens: 5000, OutputTokens: 1}
}

func TestGatewaySettlesCutStream(t *testing.T) {
	f := newFixture(t)
	f.up.Script(devupstream.Response{
		Content: []devupstream.ContentBlock{devupstream.Text("this stream will be cut before the end")},
		Usage:   &devupstream.Usage{InputTokens: 5000, OutputTokens: 400},
		Cut:     &devupstream.Cut{AfterEvents: 3},
	})
	req := f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(messagesBody(true, 1024)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, readErr := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status: got %d, want 200", resp.StatusCode)
	}
	if readErr == nil {
		t.Errorf("client read: got a clean end of stream, want an error (the cut must reach the client)")
	}
	ledger := f.waitSettled(t, userID, 1)
	answers := f.rec.answered()
	if len(answers) != 1 || !bytes.HasPrefix(answers[0].body, got) || !bytes.Contains(got, []byte("event: message_start")) {
		t.Errorf("client got %q, want a prefix of the upstream's bytes containing message_start", got)
	}
	checkDebit(t, f, ledger, startUsage(), "upstream_cut")
}

func TestGatewaySettlesStreamErrorEvent(t *testing.T) {
	f := newFixture(t)
	f.up.Script(devupstream.Response{
		Content:     []devupstream.ContentBlock{devupstream.Text("this stream fails after 200")},
		Usage:       &devupstream.Usage{InputTokens: 5000, OutputTokens: 400},
		StreamError: &devupstream.StreamError{AfterEvents: 3, Type: "overloaded_error", Message: "Overloaded"},
	})
	got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(messagesBody(true, 1024))))
	if got.status != http.StatusOK {
		t.Fatalf("status: got %d, want 200", got.status)
	}
	answers := f.rec.answered()
	if len(answers) != 1 || !bytes.Equal(got.body, answers[0].body) {
		t.Errorf("client bytes differ from the upstream's")
	}
	if !bytes.Contains(got.body, []byte("event: error\n")) {
		t.Errorf("stream: got %q, want the error event", got.body)
	}
	checkDebit(t, f, f.waitSettled(t, userID, 1), startUsage(), "stream_error")
}

func TestGatewaySettlesWhenClientDisconnects(t *testing.T) {
	f := newFixture(t)
	f.up.Script(devupstream.Response{
		Content:    []devupstream.ContentBlock{devupstream.Text("a slow answer that the client will not wait for")},
		Usage:      &devupstream.Usage{InputTokens: 5000, OutputTokens: 400},
		EventDelay: 200 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req := f.request(ctx, t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(messagesBody(true, 1024)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for sawStart := false; ; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("read stream: %v", err)
		}
		if strings.HasPrefix(line, "event: message_start") {
			sawStart = true
		}
		if sawStart && strings.HasPrefix(line, "data: ") {
			break // message_start fully received
		}
	}
	cancel()
	resp.Body.Close()
	checkDebit(t, f, f.waitSettled(t, userID, 1), startUsage(), "client_disconnect")
}

// checkDebit asserts the ledger holds one reserve and one debit that
// books u at the default prices, and that the spend agrees.
func checkDebit(t *testing.T, f *fixture, ledger []ledgerRow, u anthropic.Usage, outcome string) {
	t.Helper()
	if len(ledger) != 2 || ledger[0].Kind != "reserve" || ledger[1].Kind != "debit" {
		t.Fatalf("ledger: got %+v, want a reserve and a debit", ledger)
	}
	if ledger[1].Outcome != outcome {
		t.Errorf("debit outcome: got %q, want %q", ledger[1].Outcome, outcome)
	}
	d := ledger[1]
	got := [3]int64{d.InputTokens, d.OutputTokens, d.Amount}
	want := [3]int64{u.InputTokens, u.OutputTokens, costOf(u)}
	if got != want {
		t.Errorf("debit [input, output, amount]: got %v, want %v", got, want)
	}
	if sp := f.spend(t, userID); sp.Spent != want[2] || sp.Reserved != 0 {
		t.Errorf("spend: got spent %d reserved %d, want spent %d reserved 0", sp.Spent, sp.Reserved, want[2])
	}
}

// TestGatewayConcurrentCallsCannotOverspend sends many calls at once for a
// user whose budget covers one: exactly one may reach the upstream.
func TestGatewayConcurrentCallsCannotOverspend(t *testing.T) {
	f := newFixture(t)
	body := messagesBody(false, 2048)
	// Learn the call's worst-case reservation from a probe user's ledger.
	if got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, "probe"), strings.NewReader(body))); got.status != http.StatusOK {
		t.Fatalf("probe: got %d %s, want 200", got.status, got.body)
	}
	probe := f.waitSettled(t, "probe", 1)
	est := probe[0].Amount
	if err := f.budget.SetUserLimit(t.Context(), userID, est+est/2); err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	f.rec.hold.Store(&hold)
	before := f.rec.arrivals.Load()

	const n = 8
	tok := f.workerToken(t, convID, userID)
	results := make(chan int, n)
	for range n {
		f.sendAsync(t, tok, body, results)
	}
	// All but the admitted call must answer while the admitted one is
	// still held at the upstream door; then let it through.
	counts := map[int]int{}
	collected := 0
	deadline := time.After(2 * time.Second)
wait:
	for collected < n-1 {
		select {
		case s := <-results:
			counts[s]++
			collected++
		case <-deadline:
			break wait
		}
	}
	close(hold)
	for ; collected < n; collected++ {
		counts[<-results]++
	}
	if counts[http.StatusOK] != 1 || counts[http.StatusTooManyRequests] != n-1 {
		t.Errorf("statuses: got %v, want 1×200 and %d×429", counts, n-1)
	}
	if got := f.rec.arrivals.Load() - before; got != 1 {
		t.Errorf("upstream calls: got %d, want exactly 1", got)
	}
	f.waitSettled(t, userID, 1)
	if sp := f.spend(t, userID); sp.Spent > sp.Limit {
		t.Errorf("spend: got spent %d over limit %d", sp.Spent, sp.Limit)
	}
}

// TestGatewayHugeMaxTokensCannotBypassBudget guards against an integer
// overflow in the worst-case estimate: max_tokens of 10⁹ times the output
// price per token overflows int64, the reservation turns negative, and
// while such a call is open the user's other calls pass the budget check.
func TestGatewayHugeMaxTokensCannotBypassBudget(t *testing.T) {
	f := newFixture(t)
	const limit = 10_000_000 // 1 cent
	if err := f.budget.SetUserLimit(t.Context(), userID, limit); err != nil {
		t.Fatal(err)
	}
	tok := f.workerToken(t, convID, userID)
	normal := messagesBody(true, 1024) // worst case ≈ 1.5 cents: over the limit on its own
	if got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", tok, strings.NewReader(normal))); got.status != http.StatusTooManyRequests {
		t.Fatalf("normal call alone: got %d %s, want 429", got.status, got.body)
	}

	hold := make(chan struct{})
	f.rec.hold.Store(&hold)
	defer func() {
		select {
		case <-hold:
		default:
			close(hold)
		}
	}()
	send := func(body string) <-chan int {
		ch := make(chan int, 1)
		f.sendAsync(t, tok, body, ch)
		return ch
	}
	// waitArrivalOr waits until the upstream has seen n calls or ch answers.
	waitArrivalOr := func(n int32, ch <-chan int) (status int, arrived bool) {
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) {
			select {
			case s := <-ch:
				return s, false
			default:
			}
			if f.rec.arrivals.Load() >= n {
				return 0, true
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("neither an answer nor an upstream call within 1 s")
		return 0, false
	}

	huge := strings.Replace(normal, `"max_tokens":1024`, `"max_tokens":1000000000`, 1)
	hugeCh := send(huge)
	if status, arrived := waitArrivalOr(1, hugeCh); arrived {
		t.Errorf("max_tokens 10⁹ with a 1-cent limit: the call reached the upstream, want it refused (429 or 400)")
		if sp := f.spend(t, userID); sp.Reserved < 0 {
			t.Errorf("reserved while that call is open: got %d nano-USD, want ≥ 0 (the worst case overflowed int64)", sp.Reserved)
		}
	} else if status != http.StatusTooManyRequests && status != http.StatusBadRequest {
		t.Errorf("max_tokens 10⁹: got status %d, want 429 or 400", status)
	}

	next := f.rec.arrivals.Load() + 1
	normalCh := send(normal)
	if status, arrived := waitArrivalOr(next, normalCh); arrived {
		t.Errorf("normal over-limit call while the huge one is open: reached the upstream, want 429")
	} else if status != http.StatusTooManyRequests {
		t.Errorf("normal over-limit call while the huge one is open: got %d, want 429", status)
	}
	close(hold)
}

func TestGatewayUpstreamUnreachableIs502AndReleases(t *testing.T) {
	f := newFixture(t)
	// A gateway whose upstream address has nothing listening.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL, _ := url.Parse(dead.URL)
	dead.Close()
	gw := httptest.NewServer(gateway.New(gateway.Config{
		Upstream: deadURL, APIKey: upstreamKey, Budget: f.budget,
		Keys:   []token.Key{f.master.Derive(token.PurposeGateway, "", "")},
		Logger: slog.New(slog.DiscardHandler),
	}))
	t.Cleanup(gw.Close)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, gw.URL+contract.PathGatewayPrefix+"/v1/messages", strings.NewReader(messagesBody(false, 1024)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(contract.HeaderWorkerToken, f.workerToken(t, convID, userID))
	checkEnvelope(t, do(t, req), http.StatusBadGateway, anthropic.ErrAPI)
	ledger := f.waitSettled(t, userID, 1)
	if len(ledger) != 2 || ledger[1].Amount != 0 {
		t.Errorf("ledger: got %+v, want a reserve and a debit of 0", ledger)
	}
}

// panickingBudget fails every pre-call check with a panic.
type panickingBudget struct{ gateway.Budget }

func (panickingBudget) PreCallCheckAsync(context.Context, budget.Call) *budget.Ticket {
	panic("budget store: open /var/lib/talkide/db: permission denied")
}

// TestGatewayPanicIsAnthropicEnvelope: a panic in a gateway route answers
// in the gateway's family's shape (Anthropic's envelope, which SDKs and the
// CLI parse), not the platform's JSON, names no internals and is logged
// once with its cause.
func TestGatewayPanicIsAnthropicEnvelope(t *testing.T) {
	f := newFixture(t)
	logs := &platformtest.LogBuffer{}
	up, _ := url.Parse("http://127.0.0.1:1")
	gw := httptest.NewServer(gateway.New(gateway.Config{
		Upstream: up, APIKey: upstreamKey, Budget: panickingBudget{f.budget},
		Keys:   []token.Key{f.master.Derive(token.PurposeGateway, "", "")},
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	}))
	t.Cleanup(gw.Close)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, gw.URL+contract.PathGatewayPrefix+"/v1/messages", strings.NewReader(messagesBody(false, 1024)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(contract.HeaderWorkerToken, f.workerToken(t, convID, userID))
	got := do(t, req)
	env := checkEnvelope(t, got, http.StatusInternalServerError, anthropic.ErrAPI)
	if strings.Contains(string(got.body), "permission denied") {
		t.Errorf("the panic's text reached the client: %s", got.body)
	}
	if n := strings.Count(logs.String(), "permission denied"); n != 1 || !strings.Contains(logs.String(), env.RequestID) {
		t.Errorf("log: the panic is logged %d times (want once, with request id %s):\n%s", n, env.RequestID, logs.String())
	}
}

func TestGatewayRejectsNonJSONMessagesBody(t *testing.T) {
	f := newFixture(t)
	for _, body := range []string{"", "not json", `{"model":`, `["a"]`} {
		got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(body)))
		checkEnvelope(t, got, http.StatusBadRequest, anthropic.ErrInvalidRequest)
	}
	if n := f.rec.arrivals.Load(); n != 0 {
		t.Errorf("upstream: got %d requests, want none", n)
	}
	if l := f.ledger(t, userID); len(l) != 0 {
		t.Errorf("ledger: got %+v, want empty", l)
	}
}

// TestGatewayUnknownModelFailsClosed checks that a model missing from the
// price table is reserved and booked at the dearest rates, never for free.
func TestGatewayUnknownModelFailsClosed(t *testing.T) {
	f := newFixture(t)
	const unknown = "claude-unreleased-9" // in no price table entry
	usage := &devupstream.Usage{InputTokens: 1000, OutputTokens: 100}
	f.up.Script(devupstream.Response{Content: []devupstream.ContentBlock{devupstream.Text("a")}, Usage: usage},
		devupstream.Response{Content: []devupstream.ContentBlock{devupstream.Text("a")}, Usage: usage})
	reserve := map[string]int64{}
	for _, m := range []string{model, unknown} {
		user := "user-" + m
		body := strings.Replace(messagesBody(false, 1024), model, m, 1)
		if got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, user), strings.NewReader(body))); got.status != http.StatusOK {
			t.Fatalf("%s: got %d %s, want 200", m, got.status, got.body)
		}
		ledger := f.waitSettled(t, user, 1)
		if len(ledger) != 2 {
			t.Fatalf("%s: ledger %+v, want a reserve and a debit", m, ledger)
		}
		reserve[m] = ledger[0].Amount
		dearest := budget.DefaultPrices().Dearest()
		want := anthropic.Usage{Model: m, InputTokens: 1000, OutputTokens: 100}
		wantCost := costOf(want)
		if m == unknown && wantCost != dearest.Cost(want) {
			t.Fatalf("test premise: unknown model not priced at the dearest rates")
		}
		if ledger[1].Amount != wantCost {
			t.Errorf("%s: debit got %d nano-USD, want %d", m, ledger[1].Amount, wantCost)
		}
	}
	if reserve[unknown] <= reserve[model] {
		t.Errorf("reservation: got %d for an unknown model, %d for %s; want the unknown one dearer", reserve[unknown], reserve[model], model)
	}
}
