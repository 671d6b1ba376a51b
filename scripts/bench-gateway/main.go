// Command bench-gateway measures the latency and throughput the
// gateway-proxy adds (make bench-gateway; docs/benchmarks.md).
//
// In one process it starts an Anthropic-compatible upstream stand-in (a
// canned answer, streaming or not, after a model time of -ttfb, and -gap
// between SSE events; -ttfb 0 -gap 0 is the most adversarial upstream, where
// every microsecond of CPU the gateway spends shows) and, per store,
// the real gateway-proxy with WorkerToken validation, budget reservation
// and settlement (SQLite in a temp file; PostgreSQL in a scratch schema),
// stream metering and metrics all on; for comparison, store none is the
// gateway with a budget that admits everything and store bare a plain
// net/http/httputil reverse proxy. For each concurrency (closed-loop
// clients) and mode it runs the same load directly against the upstream and
// through the gateway, and prints percentiles, requests per second and the
// ratio, ending with one summary line per case:
//
//	bench c=16 stream=true store=postgres added_p50_ms=0.21 added_p99_ms=0.84 rps_ratio=0.93
//
// Added latency is the gateway's percentile minus the direct one, per full
// answer (request sent to last byte read), each taken without the time the
// stand-in itself spent on the call (from its reading the request to its
// last write: the model-time sleep and that sleep's timer jitter, which
// neither path controls and which would otherwise swamp a sub-millisecond
// difference). The table also prints the raw difference of whole calls.
// Flags choose the cases; the defaults are what make bench-gateway runs.
package main

import (
	"bytes"
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/gateway"
	"github.com/talkide/talkide/internal/controlplane/pgdsn"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/token"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-gateway:", err)
		os.Exit(1)
	}
}

type options struct {
	concurrency []int
	streams     []bool
	stores      []string
	duration    time.Duration
	warmup      time.Duration
	bodyBytes   int
	users       int
	pgURL       string
	ttfb        time.Duration
	gap         time.Duration
	rounds      int
}

func run() error {
	var o options
	var conc, streams, stores string
	flag.StringVar(&conc, "c", "1,16,64", "concurrencies (closed-loop clients)")
	flag.StringVar(&streams, "stream", "false,true", "modes: false (JSON answer), true (SSE stream)")
	flag.StringVar(&stores, "store", "sqlite,postgres", "budget stores: sqlite, postgres, none (no budget: the gateway's proxying alone), bare (not the gateway: a plain net/http/httputil reverse proxy)")
	flag.DurationVar(&o.duration, "d", time.Second, "measured time per run")
	flag.IntVar(&o.rounds, "rounds", 3, "alternating direct and gateway runs per case")
	flag.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "unmeasured time before each run")
	flag.IntVar(&o.bodyBytes, "body", 16<<10, "request body size in bytes (a Claude Code call with tools is tens of KB)")
	flag.IntVar(&o.users, "users", 5000, "distinct users the calls are spread over")
	flag.DurationVar(&o.ttfb, "ttfb", 20*time.Millisecond, "the stand-in's model time before its answer starts (0: none, the most adversarial upstream)")
	flag.DurationVar(&o.gap, "gap", 0, "the stand-in's time between two SSE events of a streamed answer")
	flag.StringVar(&o.pgURL, "pg", envOr("TALKIDE_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL server URL")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	for _, s := range strings.Split(conc, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return fmt.Errorf("-c %q", conc)
		}
		o.concurrency = append(o.concurrency, n)
	}
	for _, s := range strings.Split(streams, ",") {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("-stream %q", streams)
		}
		o.streams = append(o.streams, b)
	}
	o.stores = strings.Split(stores, ",")

	ctx := context.Background()
	upURL, stopUp, err := startUpstream(o.ttfb, o.gap)
	if err != nil {
		return err
	}
	defer stopUp()

	fmt.Printf("# bench-gateway: %d CPUs (GOMAXPROCS %d), %s, %s/%s\n", runtime.NumCPU(), runtime.GOMAXPROCS(0), cpuModel(), runtime.GOOS, runtime.GOARCH)
	fmt.Printf("# per case: %d alternating direct and gateway runs of %s measured after %s warm-up; body %d bytes; %d users; upstream stand-in: %s before the answer, %s between SSE events\n",
		o.rounds, o.duration, o.warmup, o.bodyBytes, o.users, o.ttfb, o.gap)
	fmt.Printf("# direct: client → stand-in; gw: client → gateway-proxy → stand-in; whole calls, request sent to last byte read\n")
	fmt.Printf("# add: what the gateway adds, gw - direct, each without the stand-in's own time (its model-time sleep and that sleep's timer jitter); raw_add: the same on whole calls\n")
	fmt.Printf("# pre: the gateway's own work before forwarding (x-talkide-gateway-overhead-ms)\n")
	fmt.Printf("%-8s %-6s %-3s %9s %9s %9s   %9s %9s %9s   %8s %8s %6s   %8s %8s   %8s %8s\n",
		"store", "stream", "c", "p50_ms", "p99_ms", "rps", "gw_p50", "gw_p99", "gw_rps", "add_p50", "add_p99", "ratio", "raw_p50", "raw_p99", "pre_p50", "pre_p99")

	var summary []string
	for _, store := range o.stores {
		gw, stop, err := startGateway(ctx, store, upURL, o)
		if err != nil {
			return fmt.Errorf("start gateway on %s: %w", store, err)
		}
		for _, stream := range o.streams {
			body := requestBody(stream, o.bodyBytes)
			for _, c := range o.concurrency {
				// Alternate direct and gateway runs so that load from outside
				// the benchmark (a shared machine) falls on both alike.
				var direct, via result
				for range o.rounds {
					direct.add(load(upURL.String()+"/v1/messages", nil, body, c, o))
					via.add(load(gw.url+contract.PathGatewayPrefix+"/v1/messages", gw.tokens, body, c, o))
				}
				direct.finish()
				via.finish()
				if direct.errors > 0 || via.errors > 0 {
					stop()
					return fmt.Errorf("store %s stream %v c %d: %d direct and %d gateway calls failed (first: %v %v)",
						store, stream, c, direct.errors, via.errors, direct.firstErr, via.firstErr)
				}
				addP50, addP99 := via.out50-direct.out50, via.out99-direct.out99
				ratio := via.rps / direct.rps
				pre50, pre99 := "-", "-" // a bare proxy sends no overhead header
				if len(via.pres) > 0 {
					pre50, pre99 = fmt.Sprintf("%.3f", ms(via.pre50)), fmt.Sprintf("%.3f", ms(via.pre99))
				}
				fmt.Printf("%-8s %-6v %-3d %9.3f %9.3f %9.0f   %9.3f %9.3f %9.0f   %8.3f %8.3f %6.2f   %8.3f %8.3f   %8s %8s\n",
					store, stream, c, ms(direct.p50), ms(direct.p99), direct.rps, ms(via.p50), ms(via.p99), via.rps, ms(addP50), ms(addP99), ratio,
					ms(via.p50-direct.p50), ms(via.p99-direct.p99), pre50, pre99)
				summary = append(summary, fmt.Sprintf("bench c=%d stream=%v store=%s added_p50_ms=%.2f added_p99_ms=%.2f rps_ratio=%.2f",
					c, stream, store, ms(addP50), ms(addP99), ratio))
			}
		}
		stats := gw.stats()
		stop()
		fmt.Printf("# %s: %s\n", store, stats)
	}
	fmt.Println()
	for _, s := range summary {
		fmt.Println(s)
	}
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// requestBody is a Messages request padded to about n bytes with a long
// user message, as a call with a system prompt and tools would be.
func requestBody(stream bool, n int) []byte {
	head := fmt.Sprintf(`{"model":"claude-sonnet-4-5-20250929","max_tokens":1024,"stream":%t,"system":"You are a coding agent.","messages":[{"role":"user","content":"`, stream)
	tail := `"}]}`
	pad := max(n-len(head)-len(tail), 0)
	return []byte(head + strings.Repeat("lorem ipsum ", pad/12+1)[:pad] + tail)
}

// The stand-in's answers: what the real API sends for a short reply.
var (
	jsonAnswer = []byte(`{"id":"msg_bench","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Hello! How can I help you with your code today?"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":4000,"cache_creation_input_tokens":0,"cache_read_input_tokens":12000,"output_tokens":14,"service_tier":"standard"}}`)
	sseAnswer  = func() [][]byte {
		evs := []string{
			`event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"msg_bench","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":4000,"cache_creation_input_tokens":0,"cache_read_input_tokens":12000,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":1,"service_tier":"standard"}}}`,
			`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
			`event: ping` + "\n" + `data: {"type": "ping"}`,
		}
		for _, w := range []string{"Hello!", " How", " can", " I", " help", " you", " with", " your", " code", " today?"} {
			evs = append(evs, `event: content_block_delta`+"\n"+`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`+w+`"}}`)
		}
		evs = append(evs,
			`event: content_block_stop`+"\n"+`data: {"type":"content_block_stop","index":0}`,
			`event: message_delta`+"\n"+`data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":14}}`,
			`event: message_stop`+"\n"+`data: {"type":"message_stop"}`)
		out := make([][]byte, len(evs))
		for i, e := range evs {
			out[i] = []byte(e + "\n\n")
		}
		return out
	}()
)

// startUpstream serves the stand-in on loopback: it reads the request,
// waits ttfb (the model's time to first token), then answers; a stream
// waits gap between events.
func startUpstream(ttfb, gap time.Duration) (*url.URL, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		t0 := time.Now()
		if seq := r.Header.Get(headerSeq); seq != "" {
			defer func() { modelTimes.Store(seq, time.Since(t0)) }()
		}
		if ttfb > 0 {
			time.Sleep(ttfb)
		}
		w.Header().Set("Request-Id", "req_bench")
		w.Header().Set("Anthropic-Ratelimit-Requests-Remaining", "999")
		if !bytes.Contains(body[:min(len(body), 200)], []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(len(jsonAnswer)))
			w.Write(jsonAnswer)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		f := w.(http.Flusher)
		for i, ev := range sseAnswer {
			if i > 0 && gap > 0 {
				time.Sleep(gap)
			}
			w.Write(ev)
			f.Flush()
		}
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	u, _ := url.Parse("http://" + ln.Addr().String())
	return u, func() { srv.Close() }, nil
}

// headerSeq numbers a benchmark call; the stand-in files the time it spent
// on the call (after reading the request, until its last write) under it in
// modelTimes, so the client can take the stand-in's own time (its sleeps,
// and their timer jitter) out of the call's latency.
const headerSeq = "X-Bench-Seq"

var modelTimes sync.Map // string(seq) → time.Duration

type gatewayUnderTest struct {
	url    string
	tokens []string // one WorkerToken per user
	stats  func() string
}

// startGateway serves the real gateway-proxy on loopback with its budget on
// store.
func startGateway(ctx context.Context, store string, up *url.URL, o options) (*gatewayUnderTest, func(), error) {
	var db *controlstore.DB
	var cleanup []func()
	stop := func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}
	switch store {
	case "sqlite":
		dir, err := os.MkdirTemp("", "bench-gateway-")
		if err != nil {
			return nil, nil, err
		}
		cleanup = append(cleanup, func() { os.RemoveAll(dir) })
		db, err = controlstore.OpenSQLite(ctx, filepath.Join(dir, "cp.db"))
		if err != nil {
			stop()
			return nil, nil, err
		}
	case "postgres":
		admin, err := sql.Open("pgx", o.pgURL)
		if err != nil {
			return nil, nil, err
		}
		schema := "bench_" + strings.ToLower(token.NewID()[:12])
		if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
			admin.Close()
			return nil, nil, fmt.Errorf("PostgreSQL at %s: %w", pgdsn.Redact(o.pgURL), pgdsn.ScrubError(err, o.pgURL))
		}
		cleanup = append(cleanup, func() { admin.Exec("DROP SCHEMA " + schema + " CASCADE"); admin.Close() })
		u, _ := url.Parse(o.pgURL)
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		db, err = controlstore.OpenPostgres(ctx, u.String(), 0)
		if err != nil {
			stop()
			return nil, nil, err
		}
	case "none":
		// No budget at all: what the proxying alone costs (for comparison).
	case "bare":
		// Not the gateway: net/http/httputil's reverse proxy with the
		// same transport and flushing, and nothing else (no token, no
		// metering): the floor of any Go proxy on this machine.
	default:
		return nil, nil, fmt.Errorf("unknown store %q", store)
	}
	reg := prometheus.NewRegistry()
	var bud gateway.Budget = admitAll{}
	if db != nil {
		cleanup = append(cleanup, func() { db.Close() })
		svc := budget.NewService(db, budget.Config{DefaultLimit: 1_000_000 * budget.NanoPerUSD, Metrics: budget.NewMetrics(reg),
			FairUse: budget.FairUse{Window: time.Minute, MaxRequests: 1_000_000}})
		cleanup = append(cleanup, func() { svc.Close() })
		bud = svc
	}
	master, err := token.NewMasterKey("bench")
	if err != nil {
		stop()
		return nil, nil, err
	}
	key := master.Derive(token.PurposeGateway, "", "")
	gw := gateway.New(gateway.Config{Upstream: up, APIKey: "sk-bench", Keys: []token.Key{key}, Budget: bud,
		Metrics: gateway.NewMetrics(reg), Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	cleanup = append(cleanup, func() { gw.Close() })
	var handler http.Handler = gw
	if store == "bare" {
		handler = bareProxy(up)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		stop()
		return nil, nil, err
	}
	srv := httpapi.NewServer(ctx, ln.Addr().String(), handler, slog.New(slog.DiscardHandler))
	go srv.Serve(ln)
	cleanup = append(cleanup, func() { srv.Close() })
	signer := token.NewSigner(token.PurposeGateway, key)
	g := &gatewayUnderTest{url: "http://" + ln.Addr().String()}
	for i := range o.users {
		tok, err := signer.Sign(token.Claims{Tenant: "bench", Env: "dev", Conversation: "conv-" + strconv.Itoa(i), User: "user-" + strconv.Itoa(i)}, time.Hour)
		if err != nil {
			stop()
			return nil, nil, err
		}
		g.tokens = append(g.tokens, tok)
	}
	g.stats = func() string {
		mfs, _ := reg.Gather()
		var parts []string
		for _, mf := range mfs {
			switch mf.GetName() {
			case "talkide_budget_write_batch_size":
				h := mf.GetMetric()[0].GetHistogram()
				parts = append(parts, fmt.Sprintf("budget writes %d in %d transactions (%.1f per commit)", int(h.GetSampleSum()), h.GetSampleCount(), h.GetSampleSum()/float64(max(h.GetSampleCount(), 1))))
			case "talkide_budget_precall_check_seconds", "talkide_gateway_overhead_seconds":
				for _, m := range mf.GetMetric() {
					h := m.GetHistogram()
					parts = append(parts, fmt.Sprintf("%s p50≈%s p99≈%s", strings.TrimPrefix(mf.GetName(), "talkide_"), quantile(h, 0.5), quantile(h, 0.99)))
				}
			case "talkide_gateway_settlements_total":
				for _, m := range mf.GetMetric() {
					parts = append(parts, fmt.Sprintf("settlements %v=%d", labels(m.GetLabel()), int(m.GetCounter().GetValue())))
				}
			}
		}
		return strings.Join(parts, "; ")
	}
	if store == "bare" {
		g.stats = func() string { return "a plain reverse proxy, not the gateway: no gateway metrics" }
	}
	return g, stop, nil
}

func labels[L interface{ GetValue() string }](ls []L) string {
	var s []string
	for _, l := range ls {
		s = append(s, l.GetValue())
	}
	return strings.Join(s, "/")
}

type result struct {
	// samples are whole calls (request sent to last byte read); outs the
	// same calls without the stand-in's own time (see headerSeq).
	samples, outs, pres []time.Duration
	elapsed             time.Duration
	p50, p99            time.Duration
	out50, out99        time.Duration
	// pre50 and pre99 are the gateway's own x-talkide-gateway-overhead-ms
	// (its work before forwarding), when it answered.
	pre50, pre99 time.Duration
	rps          float64
	errors       int64
	firstErr     error
}

// load runs c closed-loop clients against target for o.warmup + o.duration
// and reports the measured part. tokens, when set, are sent as
// X-Worker-Token, one user per call in turn.
func load(target string, tokens []string, body []byte, c int, o options) result {
	tr := &http.Transport{MaxIdleConns: 2 * c, MaxIdleConnsPerHost: 2 * c, IdleConnTimeout: time.Minute, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var (
		seq      atomic.Int64
		errs     atomic.Int64
		firstErr atomic.Value
		measure  atomic.Bool
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		all      []time.Duration
		outs     []time.Duration
		pres     []time.Duration
	)
	buf := make([][]byte, c)
	for i := range c {
		buf[i] = make([]byte, 32<<10)
	}
	for i := range c {
		wg.Go(func() {
			var mine, mineOut, minePre []time.Duration
			for !stop.Load() {
				n := seq.Add(1)
				req, _ := http.NewRequest(http.MethodPost, target, bytes.NewReader(body))
				req.ContentLength = int64(len(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Anthropic-Version", "2023-06-01")
				seqKey := strconv.FormatInt(n, 10)
				req.Header.Set(headerSeq, seqKey)
				if tokens != nil {
					req.Header.Set(contract.HeaderWorkerToken, tokens[int(n)%len(tokens)])
				}
				t0 := time.Now()
				resp, err := client.Do(req)
				if err == nil {
					for {
						_, rerr := resp.Body.Read(buf[i])
						if rerr != nil {
							if rerr != io.EOF {
								err = rerr
							}
							break
						}
					}
					resp.Body.Close()
					if err == nil && resp.StatusCode != 200 {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				d := time.Since(t0)
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				model, ok := modelTimes.LoadAndDelete(seqKey)
				if !ok {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Errorf("the stand-in filed no time for call %s", seqKey))
					continue
				}
				if measure.Load() {
					mine = append(mine, d)
					mineOut = append(mineOut, d-model.(time.Duration))
					if v, err := strconv.ParseFloat(resp.Header.Get(gateway.HeaderOverhead), 64); err == nil {
						minePre = append(minePre, time.Duration(v*float64(time.Millisecond)))
					}
				}
			}
			mu.Lock()
			all = append(all, mine...)
			outs = append(outs, mineOut...)
			pres = append(pres, minePre...)
			mu.Unlock()
		})
	}
	time.Sleep(o.warmup)
	runtime.GC()
	measure.Store(true)
	start := time.Now()
	time.Sleep(o.duration)
	measure.Store(false)
	elapsed := time.Since(start)
	stop.Store(true)
	wg.Wait()
	r := result{errors: errs.Load(), samples: all, outs: outs, pres: pres, elapsed: elapsed}
	if e, ok := firstErr.Load().(error); ok {
		r.firstErr = e
	}
	return r
}

// add merges the samples of another run into r.
func (r *result) add(o result) {
	r.samples = append(r.samples, o.samples...)
	r.outs = append(r.outs, o.outs...)
	r.pres = append(r.pres, o.pres...)
	r.elapsed += o.elapsed
	r.errors += o.errors
	if r.firstErr == nil {
		r.firstErr = o.firstErr
	}
}

// finish computes r's percentiles and rate from its samples.
func (r *result) finish() {
	all := r.samples
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	r.p50 = all[len(all)*50/100]
	r.p99 = all[min(len(all)*99/100, len(all)-1)]
	slices.Sort(r.outs)
	r.out50, r.out99 = r.outs[len(r.outs)*50/100], r.outs[min(len(r.outs)*99/100, len(r.outs)-1)]
	if len(r.pres) > 0 {
		slices.Sort(r.pres)
		r.pre50, r.pre99 = r.pres[len(r.pres)*50/100], r.pres[min(len(r.pres)*99/100, len(r.pres)-1)]
	}
	r.rps = float64(len(all)) / r.elapsed.Seconds()
}

// bareProxy is the "bare" store: a plain reverse proxy to up that serves the
// gateway's path.
func bareProxy(up *url.URL) http.Handler {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.Out.URL.Path = strings.TrimPrefix(pr.In.URL.Path, contract.PathGatewayPrefix)
			pr.Out.URL.RawPath = ""
		},
		Transport:     &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 512, IdleConnTimeout: 90 * time.Second},
		FlushInterval: -1,
	}
}

// admitAll is the "none" store: every call admitted, nothing booked.
type admitAll struct{}

func (admitAll) PreCallCheckAsync(_ context.Context, c budget.Call) *budget.Ticket {
	return budget.Decided(budget.Reservation{ID: "r", UserID: c.UserID, Amount: c.Amount}, nil)
}

func (admitAll) PostCallDebit(context.Context, budget.Reservation, budget.NanoUSD, budget.Debit) error {
	return nil
}

// quantile estimates a quantile of a histogram: the upper bound of the
// bucket it falls in.
func quantile(h interface {
	GetSampleCount() uint64
	GetBucket() []*dto.Bucket
}, q float64) string {
	want := uint64(q * float64(h.GetSampleCount()))
	for _, b := range h.GetBucket() {
		if b.GetCumulativeCount() >= want {
			return "≤" + time.Duration(b.GetUpperBound()*float64(time.Second)).String()
		}
	}
	return ">max"
}
