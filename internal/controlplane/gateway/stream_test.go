package gateway_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/gateway"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/token"
)

// sseEvents are the events the stepping upstream sends, one per step.
var sseEvents = []string{
	"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_s\",\"model\":\"" + model + "\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n",
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
	": a comment line the gateway must pass on\n\n",
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
	"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n",
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
}

// steppingUpstream writes one SSE event, flushes, and waits for the test to
// allow the next one: a gateway that buffered or merged events would
// deadlock the test.
type steppingUpstream struct {
	next chan struct{}
}

func (u *steppingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Request-Id", "req_up_stepping")
	w.WriteHeader(200)
	for i, ev := range sseEvents {
		if i > 0 {
			select {
			case <-u.next:
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, ev)
		w.(http.Flusher).Flush()
	}
}

// TestGatewayFlushesEachEventAsItArrives reads each event from the gateway
// before the upstream may send the next one.
func TestGatewayFlushesEachEventAsItArrives(t *testing.T) {
	up := &steppingUpstream{next: make(chan struct{})}
	f := newFixtureWith(t, fixtureOptions{upstream: up})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req := f.request(ctx, t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(messagesBody(true, 64)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for _, k := range []string{"X-Accel-Buffering", "Cache-Control", gateway.HeaderOverhead} {
		if resp.Header.Get(k) == "" {
			t.Errorf("header %s missing", k)
		}
	}
	if v := resp.Header.Get("X-Accel-Buffering"); v != "no" {
		t.Errorf("X-Accel-Buffering: got %q, want no", v)
	}
	if ms, err := strconv.ParseFloat(resp.Header.Get(gateway.HeaderOverhead), 64); err != nil || ms < 0 {
		t.Errorf("%s: got %q, want a non-negative number of milliseconds", gateway.HeaderOverhead, resp.Header.Get(gateway.HeaderOverhead))
	}
	br := bufio.NewReader(resp.Body)
	var got bytes.Buffer
	for i, ev := range sseEvents {
		buf := make([]byte, len(ev))
		if _, err := io.ReadFull(br, buf); err != nil {
			t.Fatalf("event %d: %v (the gateway held it back)", i, err)
		}
		if string(buf) != ev {
			t.Fatalf("event %d: got %q, want %q", i, buf, ev)
		}
		got.Write(buf)
		if i < len(sseEvents)-1 {
			up.next <- struct{}{}
		}
	}
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Errorf("bytes after the last event: %q", rest)
	}
	l := f.waitSettled(t, userID, 1)
	if d := l[len(l)-1]; d.InputTokens != 10 || d.OutputTokens != 7 || d.Outcome != "complete" {
		t.Errorf("debit: got %+v, want 10 in, 7 out, complete", d)
	}
}

// compressingUpstream gzips (or brotli-labels) whatever the development
// upstream answers, ignoring the gateway's Accept-Encoding: identity, as a
// misbehaving upstream or a proxy in between might.
type compressingUpstream struct {
	next     http.Handler
	encoding string
	sawAE    atomic.Value
}

type gzipWriter struct {
	http.ResponseWriter
	gz *gzip.Writer
}

func (w *gzipWriter) Write(p []byte) (int, error) { return w.gz.Write(p) }
func (w *gzipWriter) Flush() {
	w.gz.Flush()
	w.ResponseWriter.(http.Flusher).Flush()
}

func (u *compressingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.sawAE.Store(r.Header.Get("Accept-Encoding"))
	w.Header().Set("Content-Encoding", u.encoding)
	gz := gzip.NewWriter(w)
	u.next.ServeHTTP(&gzipWriter{ResponseWriter: w, gz: gz}, r)
	gz.Close()
}

func TestGatewayMetersCompressedAnswersAndPassesThemUnchanged(t *testing.T) {
	for _, tc := range []struct {
		encoding, outcome string
	}{{"gzip", "complete"}, {"br", "unmetered"}} {
		for _, stream := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/stream=%v", tc.encoding, stream), func(t *testing.T) {
				dev := devupstream.New(devupstream.Config{APIKey: upstreamKey})
				up := &compressingUpstream{next: dev, encoding: tc.encoding}
				f := newFixtureWith(t, fixtureOptions{upstream: up})
				dev.Script(devupstream.Response{Content: []devupstream.ContentBlock{devupstream.Text("compressed hello")}, Usage: scriptedUsage()})
				req := f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(messagesBody(stream, 1024)))
				req.Header.Set("Accept-Encoding", "gzip, br")     // the client's wish is not forwarded
				resp, err := http.DefaultTransport.RoundTrip(req) // no transparent decoding
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if ae := up.sawAE.Load(); ae != "identity" {
					t.Errorf("upstream Accept-Encoding: got %q, want identity", ae)
				}
				if resp.Header.Get("Content-Encoding") != tc.encoding {
					t.Errorf("Content-Encoding: got %q, want %q passed through", resp.Header.Get("Content-Encoding"), tc.encoding)
				}
				answers := f.rec.answered()
				if len(answers) != 1 || !bytes.Equal(got, answers[0].body) {
					t.Fatalf("client bytes differ from the upstream's compressed bytes")
				}
				zr, err := gzip.NewReader(bytes.NewReader(got))
				if err != nil {
					t.Fatal(err)
				}
				plain, _ := io.ReadAll(zr)
				if !bytes.Contains(plain, []byte("message_stop")) && !bytes.Contains(plain, []byte("compressed hello")) {
					t.Errorf("decoded answer: %q", plain)
				}
				l := f.waitSettled(t, userID, 1)
				d := l[len(l)-1]
				if d.Outcome != tc.outcome {
					t.Errorf("outcome: got %q, want %q", d.Outcome, tc.outcome)
				}
				switch tc.outcome {
				case "complete":
					if d.InputTokens != 1200 || d.OutputTokens != 42 || d.CacheRead != 300 {
						t.Errorf("debit of a gzip answer: got %+v, want the scripted usage", d)
					}
				case "unmetered":
					if d.Amount != l[0].Amount {
						t.Errorf("an answer the tee cannot decode: debited %d, want the reservation %d (never free)", d.Amount, l[0].Amount)
					}
				}
			})
		}
	}
}

// TestGatewayDisconnectAfterDeltasBillsDeliveredOutput checks that a client
// leaving mid-stream is billed the input of message_start and an estimate of
// the output it was sent, not just the 1 token message_start reports.
func TestGatewayDisconnectAfterDeltasBillsDeliveredOutput(t *testing.T) {
	f := newFixture(t)
	f.up.Script(devupstream.Response{
		Content:    []devupstream.ContentBlock{devupstream.Text(strings.Repeat("word ", 400))},
		Usage:      &devupstream.Usage{InputTokens: 5000, OutputTokens: 2000},
		EventDelay: 20 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp, err := http.DefaultClient.Do(f.request(ctx, t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(messagesBody(true, 4096))))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	deltas := 0
	for deltas < 3 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "event: content_block_delta") {
			deltas++
		}
	}
	cancel()
	resp.Body.Close()
	l := f.waitSettled(t, userID, 1)
	d := l[len(l)-1]
	if d.Outcome != "client_disconnect" || d.InputTokens != 5000 || d.OutputTokens < 3 || d.OutputTokens >= 2000 {
		t.Errorf("debit: got %+v, want client_disconnect, 5000 in, output between 3 and 2000", d)
	}
	if sp := f.spend(t, userID); sp.Reserved != 0 || sp.Spent != d.Amount {
		t.Errorf("spend: %+v", sp)
	}
}

func TestGatewayFairUseIs429WithRetryAfter(t *testing.T) {
	f := newFixtureWith(t, fixtureOptions{budget: budget.Config{FairUse: budget.FairUse{Window: time.Hour, MaxRequests: 2}}})
	tok := f.workerToken(t, convID, userID)
	for i := range 2 {
		if got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", tok, strings.NewReader(messagesBody(false, 16)))); got.status != 200 {
			t.Fatalf("call %d: got %d %s", i, got.status, got.body)
		}
	}
	got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", tok, strings.NewReader(messagesBody(false, 16))))
	env := checkEnvelope(t, got, http.StatusTooManyRequests, anthropic.ErrRateLimit)
	if ra, err := strconv.Atoi(got.header.Get("retry-after")); err != nil || ra < 3500 || ra > 3600 {
		t.Errorf("retry-after: got %q, want about an hour in seconds", got.header.Get("retry-after"))
	}
	if got.header.Get("x-should-retry") == "false" || env.Error.Details["error_code"] != "fair_use_limit" {
		t.Errorf("fair use: got x-should-retry %q, details %v; want a retryable fair_use_limit", got.header.Get("x-should-retry"), env.Error.Details)
	}
}

func TestGatewayUnknownModelDenyPolicy(t *testing.T) {
	prices := budget.DefaultPrices()
	prices.Unknown = budget.UnknownDeny
	f := newFixtureWith(t, fixtureOptions{prices: prices})
	body := strings.Replace(messagesBody(false, 16), model, "claude-unreleased-9", 1)
	got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(body)))
	checkEnvelope(t, got, http.StatusBadRequest, anthropic.ErrInvalidRequest)
	if !strings.Contains(string(got.body), "claude-unreleased-9") || f.rec.arrivals.Load() != 0 {
		t.Errorf("got %s with %d upstream calls, want a refusal naming the model and no call", got.body, f.rec.arrivals.Load())
	}
	if got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(messagesBody(false, 16)))); got.status != 200 {
		t.Errorf("a listed model under the deny policy: got %d", got.status)
	}
}

// TestGatewayRefusesDuplicatePricedMembers guards against a body priced by
// one max_tokens and run upstream with another.
func TestGatewayRefusesDuplicatePricedMembers(t *testing.T) {
	f := newFixture(t)
	body := `{"max_tokens":1000000,"model":"` + model + `","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`
	checkEnvelope(t, do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(body))),
		http.StatusBadRequest, anthropic.ErrInvalidRequest)
	if f.rec.arrivals.Load() != 0 {
		t.Error("the body reached the upstream")
	}
}

// TestGatewayExpiredTokenSaysMintAgain: an expired WorkerToken gets a 401
// that a client talking to the gateway directly must not retry as it is
// (x-should-retry: false: the same request carries the same token) but
// recognises by details.error_code to mint a new token (docs/direct-sdk.md);
// the worker's local proxy turns it into a retry for the CLI. Other bad
// tokens are final with no code.
func TestGatewayExpiredTokenSaysMintAgain(t *testing.T) {
	f := newFixture(t)
	key := f.master.Derive(token.PurposeGateway, "", "")
	expired, err := token.NewSigner(token.PurposeGateway, key).Sign(token.Claims{Tenant: tenant, Env: env, Conversation: convID, User: userID}, -time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", expired, strings.NewReader(messagesBody(false, 16))))
	envl := checkEnvelope(t, got, http.StatusUnauthorized, anthropic.ErrAuthentication)
	if v := got.header.Get("x-should-retry"); v != "false" {
		t.Errorf("expired token: x-should-retry %q, want false", v)
	}
	if code := envl.Error.Details["error_code"]; code != contract.ErrCodeTokenExpired {
		t.Errorf("expired token: error_code %v, want %s", code, contract.ErrCodeTokenExpired)
	}
	if strings.Contains(envl.Error.Message, "retried request") {
		t.Errorf("expired token: message %q promises a fresh token on retry", envl.Error.Message)
	}
	got = do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", "garbage.token.x", strings.NewReader(messagesBody(false, 16))))
	if v := got.header.Get("x-should-retry"); v != "" {
		t.Errorf("forged token: x-should-retry %q, want none", v)
	}
}

// TestGatewayConcurrentBrandNewUserOnPostgres fires 32 simultaneous calls
// of a user never seen before whose default limit covers two, through the
// gateway with the budget on PostgreSQL.
func TestGatewayConcurrentBrandNewUserOnPostgres(t *testing.T) {
	probe := newFixture(t)
	if got := do(t, probe.request(t.Context(), t, http.MethodPost, "/v1/messages", probe.workerToken(t, convID, "probe"), strings.NewReader(messagesBody(false, 2048)))); got.status != 200 {
		t.Fatalf("probe: %d", got.status)
	}
	est := probe.waitSettled(t, "probe", 1)[0].Amount
	f := newFixtureWith(t, fixtureOptions{postgres: true, budget: budget.Config{DefaultLimit: 2*est + est/2}})
	hold := make(chan struct{})
	f.rec.hold.Store(&hold)
	const n = 32
	tok := f.workerToken(t, convID, "newcomer")
	statuses := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		req := f.request(t.Context(), t, http.MethodPost, "/v1/messages", tok, strings.NewReader(messagesBody(false, 2048)))
		wg.Go(func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				statuses <- -1
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses <- resp.StatusCode
		})
	}
	// 30 refusals come back while the admitted calls wait at the upstream.
	counts := map[int]int{}
	timeout := time.After(30 * time.Second)
	for range n - 2 {
		select {
		case st := <-statuses:
			counts[st]++
		case <-timeout:
			close(hold)
			t.Fatalf("only %v answered while 2 calls are held at the upstream: more than 2 were admitted", counts)
		}
	}
	close(hold)
	wg.Wait()
	close(statuses)
	for s := range statuses {
		counts[s]++
	}
	if counts[200] != 2 || counts[429] != n-2 {
		t.Errorf("statuses: got %v, want 2×200 and %d×429", counts, n-2)
	}
	if a := f.rec.arrivals.Load(); a != 2 {
		t.Errorf("upstream calls: got %d, want 2", a)
	}
	f.waitSettled(t, "newcomer", 2)
	if sp := f.spend(t, "newcomer"); sp.Spent > sp.Limit {
		t.Errorf("spent %d over the limit %d", sp.Spent, sp.Limit)
	}
}

func TestGatewayMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := newFixtureWith(t, fixtureOptions{metrics: gateway.NewMetrics(reg)})
	f.up.Script(devupstream.Response{Content: []devupstream.ContentBlock{devupstream.Text("x")}, Usage: scriptedUsage()})
	if got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(messagesBody(true, 64)))); got.status != 200 {
		t.Fatal(got.status)
	}
	do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", "", strings.NewReader(messagesBody(true, 64))))
	f.waitSettled(t, userID, 1)
	want := map[string]float64{
		`talkide_gateway_tokens_total{kind="cache_read",model="` + model + `"}`:     300,
		`talkide_gateway_tokens_total{kind="cache_write_1h",model="` + model + `"}`: 80,
		`talkide_gateway_tokens_total{kind="cache_write_5m",model="` + model + `"}`: 120,
		`talkide_gateway_tokens_total{kind="input",model="` + model + `"}`:          1200,
		`talkide_gateway_tokens_total{kind="output",model="` + model + `"}`:         42,
		`talkide_gateway_denials_total{reason="auth"}`:                              1,
		`talkide_gateway_requests_total{code="200",path="/v1/messages"}`:            1,
		`talkide_gateway_requests_total{code="401",path="/v1/messages"}`:            1,
		`talkide_gateway_settlements_total{outcome="complete",result="booked"}`:     1,
		`talkide_gateway_inflight_streams`:                                          0,
		`talkide_gateway_overhead_seconds_count`:                                    1,
		`talkide_gateway_upstream_seconds_count{path="/v1/messages"}`:               1,
		`talkide_gateway_cost_nano_usd_total{model="` + model + `"}`:                float64(costOf(anthropic.Usage{Model: model, InputTokens: 1200, OutputTokens: 42, CacheCreationInputTokens: 200, CacheCreation5m: 120, CacheCreation1h: 80, CacheReadInputTokens: 300})),
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		got := gather(t, reg)
		var diffs []string
		for k, v := range want {
			if got[k] != v {
				diffs = append(diffs, fmt.Sprintf("%s: got %v, want %v", k, got[k], v))
			}
		}
		if len(diffs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(strings.Join(diffs, "\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gather flattens reg's metrics to "name{label="v",...}" → value (counters,
// gauges, and the _count of histograms).
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := func(suffix string) string {
				if len(labels) == 0 {
					return mf.GetName() + suffix
				}
				return mf.GetName() + suffix + "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[key("")] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[key("")] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				out[key("_count")] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}
