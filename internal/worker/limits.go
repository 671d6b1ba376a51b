package worker

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
)

// Exhaustion is a refusal, never a loss. At the open-files limit nothing
// fails cleanly: a replica-lease renewal that cannot open its file for
// longer than the trust window drops every conversation of the worker and
// kills their agents, a state save half-way answers 500, a
// create is acknowledged without its event log, the outbox cannot read its
// reports. So the worker spends its limit on purpose (fdBudget) and checks
// at the door (admission), before anything of new work is done:
//   - accepted API connections are capped (httpapi.LimitListener answers
//     503 with Retry-After beyond the cap, and accept never meets EMFILE);
//   - event streams are capped at half of the connections;
//   - loaded conversations (each holds its event log open) are capped;
//   - a create, a message, a stream or a load is refused while fewer files
//     are free than the reserve that accepted work needs (state saves,
//     event appends, lease renewals, the outbox, and the files of CLI
//     processes that may still start), while the session volume has less
//     than MinFreeDisk free, or while the worker's Go memory is above 90%
//     of its GOMEMLIMIT.
// Refusals are 503 unavailable with Retry-After in the documented error
// shape; what was accepted before keeps its files and finishes.

const (
	// transientFiles are kept free for accepted work: state saves (a temp
	// file and the directory), event log compaction, lease renewals, outbox
	// entries and the report client's and minting connections.
	transientFiles = 96
	// perProcessFiles are kept for each CLI process that may run: its
	// pipes, its jail, and the local gateway proxy's two sockets per model
	// call in flight.
	perProcessFiles = 32
	// retryAfterSeconds is the Retry-After of a refusal for open files or
	// memory; a full disk says retryAfterDiskSeconds (it needs an operator
	// or deletions, not a moment).
	retryAfterSeconds     = 2
	retryAfterDiskSeconds = 30
	// memoryShare is the share of GOMEMLIMIT above which new work is
	// refused.
	memoryShare = 0.9
)

// fdBudget is how the worker spends its open-files limit.
type fdBudget struct {
	// Limit is RLIMIT_NOFILE (the soft limit, which Go raises to the hard
	// one at start).
	Limit int
	// Reserved are the files open at start, transientFiles, and
	// perProcessFiles per CLI process slot.
	Reserved int
	// MaxConns caps accepted API connections, half of what is left.
	MaxConns int
	// MaxStreams caps event streams, half of MaxConns: the rest stays free
	// for API calls however many streams are open.
	MaxStreams int
	// MaxLoaded caps loaded conversations, the other half.
	MaxLoaded int
}

// newFDBudget divides limit, with open files open now and maxProcesses CLI
// process slots.
func newFDBudget(limit, open, maxProcesses int) fdBudget {
	b := fdBudget{Limit: limit, Reserved: open + transientFiles + perProcessFiles*maxProcesses}
	free := limit - b.Reserved
	b.MaxConns = max(free/2, 8)
	b.MaxStreams = max(b.MaxConns/2, 1)
	b.MaxLoaded = max(free-free/2, 4)
	return b
}

// openFiles counts the process's open files (httpapi.OpenFiles); without
// /proc, 0: only the static caps hold.
func openFiles(limit int) int {
	n, _ := httpapi.OpenFiles(limit)
	return n
}

// admission decides whether the worker takes new work (see above).
type admission struct {
	budget fdBudget
	// liveProcesses returns the CLI processes running now.
	liveProcesses func() int
	maxProcesses  int
	// diskDir is on the session volume; minFreeDisk its free space below
	// which new work is refused (<= 0: not checked).
	diskDir     string
	minFreeDisk int64
	// memLimit is the Go memory limit (0: none set).
	memLimit int64
	// streams counts open event streams.
	streams atomic.Int64
	// openFiles counts open files (the worker gives openFiles, cached for
	// openFilesTTL).
	openFiles func() int
}

func newAdmission(b fdBudget, maxProcesses int, liveProcesses, openFiles func() int, diskDir string, minFreeDisk int64) *admission {
	a := &admission{budget: b, liveProcesses: liveProcesses, openFiles: openFiles, maxProcesses: maxProcesses, diskDir: diskDir, minFreeDisk: minFreeDisk}
	if l := debug.SetMemoryLimit(-1); l > 0 && l < math.MaxInt64 {
		a.memLimit = l
	}
	return a
}

// openFilesTTL is how long a count of open files is reused: counting reads
// /proc/self/fd, which costs as much as there are files, and admission
// asks on every request. The static caps hold between two counts.
const openFilesTTL = 100 * time.Millisecond

// cachedFor returns f, its result reused for ttl.
func cachedFor(ttl time.Duration, f func() int) func() int {
	var mu sync.Mutex
	var at time.Time
	var v int
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		if at.IsZero() || time.Since(at) >= ttl {
			v, at = f(), time.Now()
		}
		return v
	}
}

// refusal is the answer to new work the worker does not take now.
func refusal(retryAfter int, format string, args ...any) error {
	e := httpapi.Errorf(http.StatusServiceUnavailable, contract.ErrTypeUnavailable, format, args...)
	e.Header = http.Header{"Retry-After": {strconv.Itoa(retryAfter)}}
	return e
}

// check refuses new work while the worker is near a limit.
func (a *admission) check() error {
	reserve := transientFiles
	if a.liveProcesses != nil {
		reserve += perProcessFiles * max(a.maxProcesses-a.liveProcesses(), 0)
	}
	if open := a.openFiles(); open+reserve >= a.budget.Limit {
		return refusal(retryAfterSeconds, "this worker is near its open-files limit (%d of %d open) and takes no new work right now; retry shortly", open, a.budget.Limit)
	}
	if a.minFreeDisk > 0 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(a.diskDir, &st); err == nil && int64(st.Bavail)*st.Bsize < a.minFreeDisk {
			return refusal(retryAfterDiskSeconds, "this worker's session volume has less than %d MiB free; it takes no new work until space is freed", a.minFreeDisk>>20)
		}
	}
	if a.memLimit > 0 {
		if used := goMemory(); float64(used) > memoryShare*float64(a.memLimit) {
			return refusal(retryAfterSeconds, "this worker is near its memory limit (%d of %d MiB) and takes no new work right now; retry shortly", used>>20, a.memLimit>>20)
		}
	}
	return nil
}

// admitLoad is the harness's AdmitLoad: loaded conversations are capped,
// and a load is new work.
func (a *admission) admitLoad(loaded int) error {
	if loaded >= a.budget.MaxLoaded {
		return refusal(retryAfterSeconds, "this worker has its limit of %d conversations open and takes no other right now; retry shortly", a.budget.MaxLoaded)
	}
	return a.check()
}

// admitStream takes one of the event stream places; release gives it back.
func (a *admission) admitStream() (release func(), err error) {
	if n := a.streams.Add(1); n > int64(a.budget.MaxStreams) {
		a.streams.Add(-1)
		return nil, refusal(retryAfterSeconds, "this worker serves its limit of %d event streams; retry shortly", a.budget.MaxStreams)
	}
	if err := a.check(); err != nil {
		a.streams.Add(-1)
		return nil, err
	}
	return func() { a.streams.Add(-1) }, nil
}

// goMemory is the memory the Go runtime holds from the OS (what GOMEMLIMIT
// limits).
func goMemory() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 || s[1].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64() - s[1].Value.Uint64())
}

// admitting wraps a handler of new work (a create, a message) with the
// admission check.
func (s *Server) admitting(h httpapi.HandlerFunc) httpapi.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.limits != nil {
			if err := s.limits.check(); err != nil {
				return err
			}
		}
		return h(w, r)
	}
}

// streaming wraps the event stream handler: it holds one of the stream
// places while it runs.
func (s *Server) streaming(h httpapi.HandlerFunc) httpapi.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.limits != nil {
			release, err := s.limits.admitStream()
			if err != nil {
				return err
			}
			defer release()
		}
		return h(w, r)
	}
}

// exhaustionError maps a failure of the worker's own resources (open files,
// disk space, memory) to a refusal: state saves and event appends are
// atomic, so the failed operation left no partial record, and retrying it
// (a create, a message with the same client message id) is idempotent. It
// returns nil for other errors.
func exhaustionError(err error) error {
	switch {
	case errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE):
		return wrapRefusal(retryAfterSeconds, "this worker is out of open files right now; retry shortly", err)
	case errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT):
		return wrapRefusal(retryAfterDiskSeconds, "this worker's session volume is full; retry once space is freed", err)
	case errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ENOBUFS):
		return wrapRefusal(retryAfterSeconds, "this worker is out of memory right now; retry shortly", err)
	}
	return nil
}

func wrapRefusal(retryAfter int, msg string, err error) error {
	e := httpapi.Wrap(http.StatusServiceUnavailable, contract.ErrTypeUnavailable, msg, err)
	e.Header = http.Header{"Retry-After": {strconv.Itoa(retryAfter)}}
	return e
}

// String describes the budget for the start-up log.
func (b fdBudget) String() string {
	return fmt.Sprintf("limit %d, reserved %d, connections %d, streams %d, open conversations %d", b.Limit, b.Reserved, b.MaxConns, b.MaxStreams, b.MaxLoaded)
}
