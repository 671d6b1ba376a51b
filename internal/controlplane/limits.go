package controlplane

import (
	"sync/atomic"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
)

// The control plane's open files. Each browser stream holds its browser's
// socket and each conversation being watched one to its worker (a feed,
// shared by all its streams: fanout.go); each gateway call holds two (the
// worker's and the upstream's), and the database needs files of its own
// (SQLite opens its database and log per connection; the durability sync
// opens the log again). At the open-files limit nothing fails cleanly:
// accept stalls, so requests, /healthz and model calls wait unanswered, and
// the database fails. So the control plane divides its limit at start
// (fdBudget): a reserve for the database and the process itself, and the
// rest a budget of sockets (httpapi.Files) that accepted connections, the
// sockets to workers and those to the model upstream all take from, each
// refused cleanly when it is spent (503 with Retry-After; a model call 529).
// Within it browser streams and feeds share a cap (streamSlots) that
// leaves a headroom for gateway calls, reports and API requests however
// many browsers are watching.

// dbMaxConns caps the database's connection pool (SQLite and PostgreSQL
// alike), so its files fit the reserve.
const dbMaxConns = 32

// fdBudget is how the control plane spends its open-files limit.
type fdBudget struct {
	// Limit is RLIMIT_NOFILE (the soft limit, which Go raises to the hard
	// one at start).
	Limit int
	// Reserved are the files kept for the process and the database: those
	// open at start, a margin for transient files (DNS lookups, the
	// durability sync) and three per database connection.
	Reserved int
	// Sockets is the rest: accepted connections and dialled sockets
	// together (httpapi.Files).
	Sockets int
	// MaxStreams caps browser streams and feeds together; Sockets minus it
	// (a 32nd, at least 64) stays for everything else: at least one
	// gateway call (two sockets) per 64 sockets, and API requests.
	MaxStreams int
}

// newFDBudget divides limit, with open files open now.
func newFDBudget(limit, open int) fdBudget {
	b := fdBudget{Limit: limit, Reserved: open + 64 + 3*dbMaxConns}
	b.Sockets = max(limit-b.Reserved, 16)
	headroom := min(max(b.Sockets/32, 64), b.Sockets/2)
	b.MaxStreams = max(b.Sockets-headroom, 1)
	return b
}

// currentFDBudget reads the process's limit and open files.
func currentFDBudget() fdBudget {
	limit := httpapi.OpenFilesLimit()
	open, ok := httpapi.OpenFiles(limit)
	if !ok {
		open = 32
	}
	return newFDBudget(limit, open)
}

// streamSlots counts browser streams and the feeds under them against one
// cap (max 0: no cap): a stream takes one, and a second when it opens its
// conversation's feed, which the feed holds until it closes.
type streamSlots struct {
	max int64
	n   atomic.Int64
}

// take takes n slots, reporting whether they were free.
func (s *streamSlots) take(n int64) bool {
	if s.n.Add(n) > s.max && s.max > 0 {
		s.n.Add(-n)
		return false
	}
	return true
}

// give gives n slots back.
func (s *streamSlots) give(n int64) { s.n.Add(-n) }

// errStreamLimit refuses a browser stream beyond the cap.
func errStreamLimit(n int64) error {
	e := httpapi.Errorf(503, contract.ErrTypeUnavailable, "this control plane serves its limit of %d browser streams and conversations watched; retry shortly (another replica may answer)", n)
	e.Header = map[string][]string{"Retry-After": {"2"}}
	return e
}

// errWorkerLocal answers a browser stream whose worker connection failed
// for a local reason.
func errWorkerLocal(err error) error {
	e := httpapi.Wrap(503, contract.ErrTypeUnavailable, "this control plane cannot open a connection to the worker right now (it is out of open files); retry shortly", err)
	e.Header = map[string][]string{"Retry-After": {"2"}}
	return e
}
