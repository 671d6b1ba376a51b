package gateway

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/talkide/talkide/internal/anthropic"
)

// Metrics are the gateway-proxy's Prometheus measurements. A nil *Metrics
// records nothing.
type Metrics struct {
	requests    *prometheus.CounterVec
	denials     *prometheus.CounterVec
	tokens      *prometheus.CounterVec
	cost        *prometheus.CounterVec
	overhead    prometheus.Histogram
	upstream    *prometheus.HistogramVec
	inflight    prometheus.Gauge
	settlements *prometheus.CounterVec
}

// latencyBuckets cover 50 µs to 10 s.
var latencyBuckets = []float64{.00005, .0001, .0002, .0003, .0005, .00075, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// NewMetrics creates the gateway metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "talkide_gateway_requests_total",
			Help: "Calls the gateway-proxy answered, by API path and HTTP status (the gateway's own or the upstream's).",
		}, []string{"path", "code"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "talkide_gateway_denials_total",
			Help: "Calls the gateway refused itself, by reason (budget, fair_use_requests, fair_use_tokens, unknown_model, auth, forbidden, too_large, bad_request, budget_error).",
		}, []string{"reason"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "talkide_gateway_tokens_total",
			Help: "Tokens booked, by kind (input, output, cache_write_5m, cache_write_1h, cache_read) and model (\"other\" when not in the price table).",
		}, []string{"kind", "model"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "talkide_gateway_cost_nano_usd_total",
			Help: "Cost booked, in nano-USD, by model.",
		}, []string{"model"}),
		overhead: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "talkide_gateway_overhead_seconds",
			Help:    "Latency the gateway adds before forwarding a call: token check, body read, budget reservation (what the x-talkide-gateway-overhead-ms header reports).",
			Buckets: latencyBuckets,
		}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "talkide_gateway_upstream_seconds",
			Help:    "Time from forwarding a call to the upstream's response headers, by API path.",
			Buckets: latencyBuckets,
		}, []string{"path"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "talkide_gateway_inflight_streams",
			Help: "Upstream answers being relayed right now.",
		}),
		settlements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "talkide_gateway_settlements_total",
			Help: "Post-call debits, by how the usage was measured (complete, stream_error, upstream_cut, client_disconnect, incomplete, http_error, unmetered, no_answer) and whether booking it failed.",
		}, []string{"outcome", "result"}),
	}
	reg.MustRegister(m.requests, m.denials, m.tokens, m.cost, m.overhead, m.upstream, m.inflight, m.settlements)
	return m
}

func (m *Metrics) request(path string, code int) {
	if m != nil {
		m.requests.WithLabelValues(path, statusText(code)).Inc()
	}
}

func (m *Metrics) deny(reason string) {
	if m != nil {
		m.denials.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) observeOverhead(d time.Duration) {
	if m != nil {
		m.overhead.Observe(d.Seconds())
	}
}

func (m *Metrics) observeUpstream(path string, d time.Duration) {
	if m != nil {
		m.upstream.WithLabelValues(path).Observe(d.Seconds())
	}
}

func (m *Metrics) streams(delta float64) {
	if m != nil {
		m.inflight.Add(delta)
	}
}

func (m *Metrics) settled(model string, u anthropic.Usage, cost int64, outcome string, err error) {
	if m == nil {
		return
	}
	result := "booked"
	if err != nil {
		result = "failed"
	}
	m.settlements.WithLabelValues(outcome, result).Inc()
	if err != nil {
		return
	}
	cw5 := max(u.CacheCreation5m, 0)
	for kind, n := range map[string]int64{
		"input": u.InputTokens, "output": u.OutputTokens, "cache_write_5m": cw5,
		"cache_write_1h": max(u.CacheCreationInputTokens, cw5+max(u.CacheCreation1h, 0)) - cw5, "cache_read": u.CacheReadInputTokens,
	} {
		if n > 0 {
			m.tokens.WithLabelValues(kind, model).Add(float64(n))
		}
	}
	if cost > 0 {
		m.cost.WithLabelValues(model).Add(float64(cost))
	}
}

// statusText is a status code as a label, without allocating for the common
// ones.
func statusText(code int) string {
	switch code {
	case 200:
		return "200"
	case 400:
		return "400"
	case 401:
		return "401"
	case 403:
		return "403"
	case 404:
		return "404"
	case 413:
		return "413"
	case 429:
		return "429"
	case 500:
		return "500"
	case 502:
		return "502"
	case 503:
		return "503"
	case 504:
		return "504"
	case 529:
		return "529"
	}
	return prometheusCode(code)
}

func prometheusCode(code int) string {
	if code < 100 || code > 999 {
		return "other"
	}
	return string([]byte{byte('0' + code/100), byte('0' + code/10%10), byte('0' + code%10)})
}
