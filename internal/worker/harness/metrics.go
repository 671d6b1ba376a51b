package harness

import (
	"encoding/json"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/talkide/talkide/internal/contract"
)

// metrics are the harness's Prometheus metrics.
type metrics struct {
	turns  *prometheus.CounterVec
	queued prometheus.Counter
	events *prometheus.CounterVec
	limits *prometheus.CounterVec
	saves  prometheus.Counter
	walks  prometheus.Counter
	syncs  prometheus.Counter
}

// RegisterMetrics registers the harness's metrics with reg: live CLI
// processes and their cap, turns waiting for a process, loaded
// conversations, turns by outcome, queued turns, events by type, syncs of
// event logs, writes of conversations' state files and walks of their
// directories.
func (h *Harness) RegisterMetrics(reg prometheus.Registerer) {
	m := &metrics{
		turns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "talkide_worker_turns_total",
			Help: "Turns that ended, by outcome (completed, or the turn_failed reason)."}, []string{"outcome"}),
		queued: prometheus.NewCounter(prometheus.CounterOpts{Name: "talkide_worker_turns_queued_total",
			Help: "Turns that had to wait for a free agent process."}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "talkide_worker_events_total",
			Help: "Events stored in conversations' event logs, by type."}, []string{"type"}),
		limits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "talkide_worker_agent_limit_hits_total",
			Help: "Times an agent hit one of its limits (memory, processes, disk), by limit."}, []string{"limit"}),
		saves: prometheus.NewCounter(prometheus.CounterOpts{Name: "talkide_worker_state_saves_total",
			Help: "Conversation states saved (each written in place into one of its two slots and synced, on the session volume)."}),
		syncs: prometheus.NewCounter(prometheus.CounterOpts{Name: "talkide_worker_event_syncs_total",
			Help: "Syncs of conversations' event logs; events_total over this is how many events a sync stored, on average (more under load: the events of lines the agent wrote together share one sync)."}),
		walks: prometheus.NewCounter(prometheus.CounterOpts{Name: "talkide_worker_disk_walks_total",
			Help: "Walks of conversations' directories for the disk limits (the agent is frozen during each)."}),
	}
	reg.MustRegister(m.turns, m.queued, m.events, m.limits, m.saves, m.walks, m.syncs,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "talkide_worker_cli_processes",
			Help: "Live Claude Code CLI processes."}, func() float64 { return float64(h.LiveProcesses()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "talkide_worker_cli_processes_max",
			Help: "The cap on live CLI processes (TALKIDE_MAX_PROCESSES)."}, func() float64 { return float64(h.cfg.MaxProcesses) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "talkide_worker_turns_waiting",
			Help: "Turns waiting for a free agent process."}, func() float64 { return float64(h.WaitingTurns()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "talkide_worker_conversations_loaded",
			Help: "Conversations this replica owns and has loaded."}, func() float64 { return float64(len(h.loaded())) }),
	)
	h.metrics.Store(m)
}

// observe counts a stored event.
func (m *metrics) observe(ev contract.Event) {
	m.events.WithLabelValues(string(ev.Type)).Inc()
	switch ev.Type {
	case contract.EventTurnCompleted:
		m.turns.WithLabelValues("completed").Inc()
	case contract.EventTurnFailed:
		var f contract.TurnFailed
		_ = json.Unmarshal(ev.Data, &f)
		m.turns.WithLabelValues(f.Reason).Inc()
	case contract.EventTurnQueued:
		m.queued.Inc()
	case contract.EventLimitReached:
		var l contract.LimitReached
		_ = json.Unmarshal(ev.Data, &l)
		m.limits.WithLabelValues(l.Limit).Inc()
	}
}
