package budget

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the UserBudgetService's Prometheus measurements. A nil
// *Metrics records nothing.
type Metrics struct {
	reserveSeconds *prometheus.HistogramVec
	batchSize      prometheus.Histogram
	costNano       *prometheus.CounterVec
	predictions    *prometheus.CounterVec
}

// NewMetrics creates the budget metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reserveSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "talkide_budget_precall_check_seconds",
			Help:    "Time of the pre-call check (a durable reservation or a refusal), by result.",
			Buckets: []float64{.00005, .0001, .0002, .0005, .001, .002, .005, .01, .025, .1, .5},
		}, []string{"result"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "talkide_budget_write_batch_size",
			Help:    "Budget writes committed per transaction by the writer.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}),
		costNano: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "talkide_budget_debited_nano_usd_total",
			Help: "Cost booked by post-call debits, in nano-USD, by tenant.",
		}, []string{"tenant"}),
		predictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "talkide_budget_precall_predictions_total",
			Help: "Pipelined pre-call checks by path: predicted (forwarded while the reservation commits), exact (the database answered first), refused (predicted, then refused by the database or failed: the call was cancelled).",
		}, []string{"path"}),
	}
	for _, path := range []string{"predicted", "exact", "refused"} {
		m.predictions.WithLabelValues(path) // exported from the start, at 0
	}
	reg.MustRegister(m.reserveSeconds, m.batchSize, m.costNano, m.predictions)
	return m
}

func (m *Metrics) observeReserve(d time.Duration, err error) {
	if m == nil {
		return
	}
	result := "admitted"
	switch {
	case errors.Is(err, ErrDenied):
		result = "denied_budget"
	case errors.Is(err, ErrFairUse):
		result = "denied_fair_use"
	case err != nil:
		result = "error"
	}
	m.reserveSeconds.WithLabelValues(result).Observe(d.Seconds())
}

func (m *Metrics) observeBatch(n int) {
	if m != nil {
		m.batchSize.Observe(float64(n))
	}
}

func (m *Metrics) observeDebit(res Reservation, actual NanoUSD, _ Debit) {
	if m != nil {
		m.costNano.WithLabelValues(res.Tenant).Add(float64(actual))
	}
}

func (m *Metrics) observePrediction(path string) {
	if m != nil {
		m.predictions.WithLabelValues(path).Inc()
	}
}
