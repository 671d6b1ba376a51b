package outbox

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the outbox's Prometheus measurements. A nil *Metrics records
// nothing.
type Metrics struct {
	entries   prometheus.Gauge
	bytes     prometheus.Gauge
	fullTotal prometheus.Counter
	delivers  prometheus.Counter
	deadTotal prometheus.Counter
	retries   prometheus.Counter
}

// NewMetrics creates the outbox metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		entries:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "talkide_worker_outbox_entries", Help: "Reports waiting in the worker's outbox."}),
		bytes:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "talkide_worker_outbox_bytes", Help: "Size of the reports waiting in the worker's outbox."}),
		fullTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: "talkide_worker_outbox_full_total", Help: "Reports refused because the outbox was at its bound (the event feed retries them later)."}),
		delivers:  prometheus.NewCounter(prometheus.CounterOpts{Name: "talkide_worker_outbox_delivered_total", Help: "Reports the control plane acknowledged."}),
		deadTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: "talkide_worker_outbox_dead_total", Help: "Reports the control plane refused for good, moved to the outbox's dead/ folder."}),
		retries:   prometheus.NewCounter(prometheus.CounterOpts{Name: "talkide_worker_outbox_retries_total", Help: "Failed delivery attempts that will be retried."}),
	}
	reg.MustRegister(m.entries, m.bytes, m.fullTotal, m.delivers, m.deadTotal, m.retries)
	return m
}

func (m *Metrics) setSize(entries int, bytes int64) {
	if m != nil {
		m.entries.Set(float64(entries))
		m.bytes.Set(float64(bytes))
	}
}

func (m *Metrics) full() {
	if m != nil {
		m.fullTotal.Inc()
	}
}

func (m *Metrics) delivered() {
	if m != nil {
		m.delivers.Inc()
	}
}

func (m *Metrics) dead() {
	if m != nil {
		m.deadTotal.Inc()
	}
}

func (m *Metrics) retry() {
	if m != nil {
		m.retries.Inc()
	}
}
