package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"testing"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/gateway"
	"github.com/talkide/talkide/internal/token"
)

// cannedUpstream answers every call at once with a fixed stream or message.
type cannedUpstream struct{ sse, json []byte }

func newCannedUpstream() *cannedUpstream {
	var sse bytes.Buffer
	sse.WriteString("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"" + model + "\",\"usage\":{\"input_tokens\":4000,\"cache_read_input_tokens\":12000,\"output_tokens\":1}}}\n\n")
	for i := range 10 {
		fmt.Fprintf(&sse, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"word %d \"}}\n\n", i)
	}
	sse.WriteString("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":14}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	return &cannedUpstream{sse: sse.Bytes(),
		json: []byte(`{"id":"m","type":"message","model":"` + model + `","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":4000,"output_tokens":14}}`)}
}

func (u *cannedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if bytes.Contains(body[:min(len(body), 200)], []byte(`"stream":true`)) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write(u.sse)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(u.json)
}

// admitAll is a Budget that admits everything and books nothing: the
// proxying alone.
type admitAll struct{}

func (admitAll) PreCallCheckAsync(_ context.Context, c budget.Call) *budget.Ticket {
	return budget.Decided(budget.Reservation{ID: "r", UserID: c.UserID, Amount: c.Amount}, nil)
}
func (admitAll) PostCallDebit(context.Context, budget.Reservation, budget.NanoUSD, budget.Debit) error {
	return nil
}

// BenchmarkGateway measures one call through the gateway-proxy (token
// check, body read, head scan, reservation, forwarding, stream metering,
// settlement) against an instant upstream, with the budget on SQLite or
// PostgreSQL, or none (the proxying alone); sequential and parallel.
func BenchmarkGateway(b *testing.B) {
	up := httptest.NewServer(newCannedUpstream())
	defer up.Close()
	upURL, _ := url.Parse(up.URL)
	body := []byte(strings.Replace(messagesBody(true, 1024), `"Say hello."`, `"`+strings.Repeat("lorem ipsum ", 1300)+`"`, 1)) // ~16 KB
	for _, store := range []string{"none", "sqlite", "postgres"} {
		for _, stream := range []bool{true, false} {
			for _, parallel := range []bool{false, true} {
				b.Run(fmt.Sprintf("store=%s/stream=%v/parallel=%v", store, stream, parallel), func(b *testing.B) {
					master, _ := token.NewMasterKey("k")
					key := master.Derive(token.PurposeGateway, "", "")
					var bud gateway.Budget = admitAll{}
					var svc *budget.Service
					if store != "none" {
						// A limit no run of b.N calls reaches.
						f := newFixtureWith(b, fixtureOptions{postgres: store == "postgres", budget: budget.Config{DefaultLimit: 1_000_000 * budget.NanoPerUSD}})
						svc = f.budget
						bud = svc
					}
					gw := gateway.New(gateway.Config{Upstream: upURL, Keys: []token.Key{key}, Budget: bud, Logger: slog.New(slog.DiscardHandler)})
					srv := httptest.NewServer(gw)
					defer func() { srv.Close(); gw.Close() }()
					tok, _ := token.NewSigner(token.PurposeGateway, key).Sign(token.Claims{Tenant: tenant, Env: env, Conversation: convID, User: userID}, token.WorkerTokenTTL)
					reqBody := body
					if !stream {
						reqBody = bytes.Replace(body, []byte(`"stream":true`), []byte(`"stream":false`), 1)
					}
					client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
					one := func() {
						req, _ := http.NewRequest(http.MethodPost, srv.URL+contract.PathGatewayPrefix+"/v1/messages", bytes.NewReader(reqBody))
						req.Header.Set(contract.HeaderWorkerToken, tok)
						resp, err := client.Do(req)
						if err != nil {
							b.Fatal(err)
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != 200 {
							b.Fatalf("status %d", resp.StatusCode)
						}
					}
					b.SetBytes(int64(len(reqBody)))
					b.ResetTimer()
					if parallel {
						b.SetParallelism(8)
						b.RunParallel(func(pb *testing.PB) {
							for pb.Next() {
								one()
							}
						})
					} else {
						for b.Loop() {
							one()
						}
					}
				})
			}
		}
	}
}

// endlessStream is an upstream that streams size bytes of content deltas
// after message_start, then ends the message.
type endlessStream struct{ size int }

func (u endlessStream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\""+model+"\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n")
	ev := []byte("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"" + strings.Repeat("x", 900) + "\"}}\n\n")
	for sent := 0; sent < u.size; sent += len(ev) {
		if _, err := w.Write(ev); err != nil {
			return
		}
	}
	io.WriteString(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
}

// TestGatewayStreamMemoryIsBounded relays a 64 MB stream and checks the
// gateway allocated far less than the stream's size: nothing buffers the
// whole body (the copy buffer, the meter's line and the settlement are all
// it keeps per stream).
func TestGatewayStreamMemoryIsBounded(t *testing.T) {
	const size = 64 << 20
	f := newFixtureWith(t, fixtureOptions{upstream: endlessStream{size: size}, noRecord: true})
	req := f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(messagesBody(true, 64)))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n < size {
		t.Fatalf("relayed %d bytes, %v; want at least %d", n, err, size)
	}
	runtime.ReadMemStats(&after)
	// Everything in this process allocates here (the upstream, the client,
	// the gateway): well under the stream's size means no whole-body copy.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size/4 {
		t.Errorf("allocated %d MB while relaying a %d MB stream, want under %d MB", alloc>>20, size>>20, size>>22)
	}
	l := f.waitSettled(t, userID, 1)
	if d := l[len(l)-1]; d.OutputTokens != 7 || d.Outcome != "complete" {
		t.Errorf("debit: got %+v", d)
	}
}
