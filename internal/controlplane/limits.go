package controlplane

import (
	"errors"
	"syscall"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
)

// The control plane's open files. Each browser stream holds its browser's
// socket and each conversation being watched one to its worker (shared by
// all its streams: fanout.go), so at worst (one stream per conversation)
// a stream holds two; each gateway call holds two (the worker's and the
// upstream's), and the database needs files of its own (SQLite opens
// its database and log per connection; the durability sync opens the log
// again). At the open-files limit nothing fails cleanly: accept stalls, so
// requests, /healthz and model calls wait unanswered, and the database
// fails. So the control plane divides its limit at start (fdBudget):
// a reserve for the database and the process itself, a cap on accepted
// connections (httpapi.LimitListener answers 503 beyond it), and within
// that a cap on browser streams (503 with Retry-After beyond it), which
// leaves room for gateway calls and API requests however many browsers
// are watching.

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
	// MaxConns caps accepted connections: each may need a second socket
	// (to a worker or the model upstream).
	MaxConns int
	// MaxStreams caps browser streams, at half of MaxConns: the other half
	// stays free for gateway calls, reports and API requests.
	MaxStreams int
}

// newFDBudget divides limit, with open files open now.
func newFDBudget(limit, open int) fdBudget {
	b := fdBudget{Limit: limit, Reserved: open + 64 + 3*dbMaxConns}
	b.MaxConns = max((limit-b.Reserved)/2, 8)
	b.MaxStreams = max(b.MaxConns/2, 1)
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

// errStreamLimit refuses a browser stream beyond the cap.
func errStreamLimit(n int64) error {
	e := httpapi.Errorf(503, contract.ErrTypeUnavailable, "this control plane serves its limit of %d browser streams; retry shortly (another replica may answer)", n)
	e.Header = map[string][]string{"Retry-After": {"2"}}
	return e
}

// localExhaustion reports whether err is this process running out of a
// resource (open files, socket buffers, memory) rather than the far side
// failing.
func localExhaustion(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// errWorkerLocal answers a browser stream whose worker connection failed
// for a local reason.
func errWorkerLocal(err error) error {
	e := httpapi.Wrap(503, contract.ErrTypeUnavailable, "this control plane cannot open a connection to the worker right now (it is out of open files); retry shortly", err)
	e.Header = map[string][]string{"Retry-After": {"2"}}
	return e
}
