// Package outbox is the worker's durable outbox for writes to the control
// plane that have no other durable source: the issue writes of the
// talkide-issue-tracking MCP server (event reports are sent from the event
// log by package reportfeed). A report is written
// to the session volume (temp file, fsync, rename, fsync of the directory)
// before Put returns; a sender delivers it, retrying with exponential
// backoff and full jitter while the control plane is unreachable or answers
// 429 or 5xx, and removes it only once the control plane acknowledged it.
// A worker restart reopens the directory and resumes sending.
//
// Reports of one conversation are delivered in the order they were put, one
// at a time; conversations proceed independently (a bounded number at
// once). A report the control plane refuses for good (4xx other than 408
// and 429) is moved to dead/ with a log line and a metric, and the
// conversation's next report follows. The worker's own trouble (out of
// open files or memory while reading an entry) is retried like an
// unreachable control plane: a stored report is never dropped for it.
//
// The outbox is bounded (Config.MaxEntries, Config.MaxBytes). When full,
// Put fails with ErrFull, counts talkide_worker_outbox_full_total and logs
// once per episode; the caller decides (the MCP tools tell the agent to try
// later).
//
// Main types: Outbox, Entry, Sender (implemented by package reportclient).
// It does not know the wire format of reports or how to authenticate.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/atomicfile"
)

// FormatVersion is the on-disk format of an entry file; files of another
// version are refused (left in place and logged).
const FormatVersion = 1

// Entry is one report waiting for delivery.
type Entry struct {
	Format int `json:"format"`
	// Seq orders the entries of the outbox; assigned by Put.
	Seq int64 `json:"seq"`
	// Conversation is the conversation the report belongs to (its
	// WorkerToken is minted for it).
	Conversation string `json:"conversation"`
	// Method and Path are the request to send, e.g. POST
	// /api/internal/worker/activity.
	Method string `json:"method"`
	Path   string `json:"path"`
	// Key is the report's idempotency key (also inside Body).
	Key string `json:"key"`
	// Body is the JSON request body.
	Body      json.RawMessage `json:"body"`
	CreatedAt time.Time       `json:"created_at"`
}

// Sender delivers one entry. It returns the control plane's answer body on
// success, a *PermanentError when the control plane refused the report for
// good, and any other error for a failure worth retrying.
type Sender interface {
	Send(ctx context.Context, e Entry) ([]byte, error)
}

// PermanentError is a refusal that retrying cannot fix (e.g. 400, 404, 409).
type PermanentError struct {
	Status int
	Msg    string
}

func (e *PermanentError) Error() string {
	return fmt.Sprintf("report refused: %d %s", e.Status, e.Msg)
}

// Errors returned by Outbox methods.
var (
	// ErrFull: the outbox holds Config.MaxEntries entries or
	// Config.MaxBytes bytes; nothing was stored.
	ErrFull = errors.New("outbox full")
	// ErrClosed: Run has ended.
	ErrClosed = errors.New("outbox closed")
)

// Config configures an Outbox. Zero values take the defaults noted.
type Config struct {
	// Dir is the outbox directory, on the session volume. Required.
	Dir string
	// Sender delivers entries. Required.
	Sender Sender
	// MaxEntries bounds the number of waiting entries. Default 20000.
	MaxEntries int
	// MaxBytes bounds the total size of waiting entry bodies. Default 64 MiB.
	MaxBytes int64
	// MinBackoff and MaxBackoff bound the wait between attempts (full
	// jitter: a random wait up to min(MaxBackoff, MinBackoff·2^n)).
	// Defaults 200 ms and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// Parallel is how many conversations are sent at once. Default 8.
	Parallel int
	// AttemptTimeout bounds one delivery attempt. Default 30 s.
	AttemptTimeout time.Duration
	// Metrics receives the outbox's measurements; nil records none.
	Metrics *Metrics
	Logger  *slog.Logger
}

// Result is how an entry ended.
type Result struct {
	// Delivered is true when the control plane acknowledged the entry;
	// Body is then its answer. Otherwise Err says why it was dropped.
	Delivered bool
	Body      []byte
	Err       error
}

// lane is the queue of one conversation.
type lane struct {
	// seqs are the waiting entries, oldest first.
	seqs []int64
	// sizes are their body sizes, by seq.
	sizes map[int64]int64
	// running is set while a goroutine sends the lane.
	running bool
}

// Outbox is a durable, bounded, per-conversation ordered queue of reports.
type Outbox struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex
	// lanes by conversation; guarded by mu.
	lanes map[string]*lane
	// nextSeq is the seq of the next Put; guarded by mu.
	nextSeq int64
	// entries and bytes are the totals of waiting entries; guarded by mu.
	entries int
	bytes   int64
	// full is set while Put refuses, to log once per episode; guarded by mu.
	full bool
	// waiters are the channels of Wait calls, by seq; guarded by mu.
	waiters map[int64][]chan Result
	// wake is signalled when a lane gets work; buffered, never closed.
	wake chan struct{}
	// space is closed and replaced whenever room is freed; guarded by mu.
	space chan struct{}
	// closed is set once Run ends; guarded by mu.
	closed bool
}

// Open opens (creating) the outbox directory and loads the waiting
// entries. Call Run to send them.
func Open(cfg Config) (*Outbox, error) {
	if cfg.Dir == "" || cfg.Sender == nil {
		return nil, errors.New("outbox config: Dir and Sender are required")
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = 20000
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 64 << 20
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 200 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(30*time.Second, cfg.MinBackoff)
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 8
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	o := &Outbox{cfg: cfg, log: cfg.Logger, lanes: map[string]*lane{}, nextSeq: 1, waiters: map[int64][]chan Result{},
		wake: make(chan struct{}, 1), space: make(chan struct{})}
	for _, d := range []string{o.queueDir(), o.deadDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("open outbox: %w", err)
		}
	}
	if err := o.load(); err != nil {
		return nil, err
	}
	o.cfg.Metrics.setSize(o.entries, o.bytes)
	return o, nil
}

func (o *Outbox) queueDir() string { return filepath.Join(o.cfg.Dir, "queue") }
func (o *Outbox) deadDir() string  { return filepath.Join(o.cfg.Dir, "dead") }

// entryPath is queue/<conversation>/<seq, 20 digits>.json: names sort in seq order.
func (o *Outbox) entryPath(conv string, seq int64) string {
	return filepath.Join(o.queueDir(), conv, fmt.Sprintf("%020d.json", seq))
}

func (o *Outbox) load() error {
	convs, err := os.ReadDir(o.queueDir())
	if err != nil {
		return fmt.Errorf("open outbox: %w", err)
	}
	for _, c := range convs {
		if !c.IsDir() || contract.ValidConversationID(c.Name()) != nil {
			continue
		}
		files, err := os.ReadDir(filepath.Join(o.queueDir(), c.Name()))
		if err != nil {
			return fmt.Errorf("open outbox: %w", err)
		}
		for _, f := range files {
			name, ok := strings.CutSuffix(f.Name(), ".json")
			seq, err := strconv.ParseInt(name, 10, 64)
			if !ok || err != nil || seq < 1 {
				continue // a temp file of an interrupted write, or a stranger
			}
			info, err := f.Info()
			if err != nil {
				return fmt.Errorf("open outbox: %w", err)
			}
			o.addLocked(c.Name(), seq, info.Size())
			o.nextSeq = max(o.nextSeq, seq+1)
		}
	}
	for _, l := range o.lanes {
		slices.Sort(l.seqs)
	}
	if o.entries > 0 {
		o.log.Info("outbox reopened with waiting reports", "entries", o.entries, "bytes", o.bytes)
	}
	return nil
}

func (o *Outbox) addLocked(conv string, seq, size int64) {
	l := o.lanes[conv]
	if l == nil {
		l = &lane{sizes: map[int64]int64{}}
		o.lanes[conv] = l
	}
	l.seqs = append(l.seqs, seq)
	l.sizes[seq] = size
	o.entries++
	o.bytes += size
}

// Put stores a report for conversation conv durably and returns its seq. It
// fails with ErrFull when the outbox is at its bound, and with the cause
// (e.g. syscall.ENOSPC, syscall.EMFILE) when the entry could not be written;
// either way nothing was stored (no partial file stays) and the caller tries
// again later.
func (o *Outbox) Put(conv, method, path, key string, body []byte) (int64, error) {
	if err := contract.ValidConversationID(conv); err != nil {
		return 0, err
	}
	e := Entry{Format: FormatVersion, Conversation: conv, Method: method, Path: path, Key: key, Body: body, CreatedAt: time.Now().UTC()}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return 0, ErrClosed
	}
	b, err := json.Marshal(e) // size check before assigning a seq
	if err != nil {
		return 0, fmt.Errorf("put report: %w", err)
	}
	size := int64(len(b)) + 30
	if o.entries+1 > o.cfg.MaxEntries || o.bytes+size > o.cfg.MaxBytes {
		o.cfg.Metrics.full()
		if !o.full {
			o.full = true
			o.log.Warn("outbox full: reports wait or are refused until the control plane takes some", "entries", o.entries, "bytes", o.bytes,
				"max_entries", o.cfg.MaxEntries, "max_bytes", o.cfg.MaxBytes)
		}
		return 0, ErrFull
	}
	e.Seq = o.nextSeq
	b, _ = json.Marshal(e)
	// Writing under the lock keeps seqs in file order per conversation; an
	// fsynced write is a few milliseconds, far below report rates.
	dir := filepath.Join(o.queueDir(), conv)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("put report: %w", err)
	}
	if err := atomicfile.WriteFile(o.entryPath(conv, e.Seq), b, 0o600); err != nil {
		return 0, fmt.Errorf("put report: %w", err)
	}
	o.nextSeq++
	o.addLocked(conv, e.Seq, int64(len(b)))
	o.cfg.Metrics.setSize(o.entries, o.bytes)
	select {
	case o.wake <- struct{}{}:
	default:
	}
	return e.Seq, nil
}

// Wait blocks until entry seq is delivered or dropped, or ctx ends. An entry
// no longer waiting (delivered before Wait was called, or unknown) gives
// ok=false at once.
func (o *Outbox) Wait(ctx context.Context, conv string, seq int64) (r Result, ok bool) {
	o.mu.Lock()
	l := o.lanes[conv]
	if l == nil || l.sizes[seq] == 0 {
		o.mu.Unlock()
		return Result{}, false
	}
	ch := make(chan Result, 1)
	o.waiters[seq] = append(o.waiters[seq], ch)
	o.mu.Unlock()
	select {
	case r := <-ch:
		return r, true
	case <-ctx.Done():
		return Result{Err: ctx.Err()}, false
	}
}

// Space returns a channel closed when room is next freed (an entry left).
func (o *Outbox) Space() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.space
}

// Len returns the number of waiting entries and their size in bytes.
func (o *Outbox) Len() (entries int, bytes int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.entries, o.bytes
}

// Run sends waiting entries until ctx ends, then waits for its senders.
func (o *Outbox) Run(ctx context.Context) error {
	sem := make(chan struct{}, o.cfg.Parallel)
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		o.mu.Lock()
		o.closed = true
		o.mu.Unlock()
	}()
	for {
		// Start a sender for every lane with work and none running.
		o.mu.Lock()
		var start []string
		for conv, l := range o.lanes {
			if len(l.seqs) > 0 && !l.running {
				start = append(start, conv)
			}
		}
		slices.Sort(start)
		o.mu.Unlock()
		for _, conv := range start {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return nil
			}
			o.mu.Lock()
			l := o.lanes[conv]
			run := l != nil && len(l.seqs) > 0 && !l.running
			if run {
				l.running = true
			}
			o.mu.Unlock()
			if !run {
				<-sem
				continue
			}
			wg.Go(func() {
				defer func() { <-sem }()
				o.sendLane(ctx, conv)
				select { // look again: the lane may have grown meanwhile
				case o.wake <- struct{}{}:
				default:
				}
			})
		}
		select {
		case <-ctx.Done():
			return nil
		case <-o.wake:
		}
	}
}

// sendLane delivers conv's entries in order until the lane is empty or ctx
// ends.
func (o *Outbox) sendLane(ctx context.Context, conv string) {
	defer func() {
		o.mu.Lock()
		if l := o.lanes[conv]; l != nil {
			l.running = false
			if len(l.seqs) == 0 {
				delete(o.lanes, conv)
			}
		}
		o.mu.Unlock()
	}()
	for {
		o.mu.Lock()
		l := o.lanes[conv]
		if l == nil || len(l.seqs) == 0 {
			o.mu.Unlock()
			return
		}
		seq := l.seqs[0]
		o.mu.Unlock()
		r, err := o.deliver(ctx, conv, seq)
		if err != nil {
			return // ctx ended; the entry stays for the next run
		}
		o.finish(conv, seq, r)
	}
}

// deliver sends entry seq until it is acknowledged, refused for good, or
// ctx ends (error).
func (o *Outbox) deliver(ctx context.Context, conv string, seq int64) (Result, error) {
	b, err := o.readEntry(ctx, conv, seq)
	if errors.Is(err, fs.ErrNotExist) {
		// Removed from under the outbox: there is nothing left to send.
		o.log.Error("outbox entry vanished before delivery", "conversation", conv, "seq", seq, "err", err)
		return Result{Err: err}, nil
	}
	if err != nil {
		return Result{}, err // ctx ended; the entry stays for the next run
	}
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil || e.Format != FormatVersion {
		if err == nil {
			err = fmt.Errorf("entry format %d, want %d", e.Format, FormatVersion)
		}
		o.log.Error("unreadable outbox entry moved to dead", "conversation", conv, "seq", seq, "err", err)
		o.bury(conv, seq)
		return Result{Err: err}, nil
	}
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, o.cfg.AttemptTimeout)
		body, err := o.cfg.Sender.Send(actx, e)
		cancel()
		if err == nil {
			o.cfg.Metrics.delivered()
			return Result{Delivered: true, Body: body}, nil
		}
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		var pe *PermanentError
		if errors.As(err, &pe) {
			o.log.Error("control plane refused a report; moved to dead", "conversation", conv, "seq", seq, "key", e.Key, "path", e.Path, "err", err)
			o.cfg.Metrics.dead()
			o.bury(conv, seq)
			return Result{Err: err}, nil
		}
		o.cfg.Metrics.retry()
		if attempt == 0 || attempt%20 == 0 {
			o.log.Warn("report not delivered; retrying", "conversation", conv, "seq", seq, "attempt", attempt+1, "err", err)
		}
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-time.After(o.backoff(attempt)):
		}
	}
}

// readEntry reads entry seq's file, retrying with backoff while reading
// fails for another reason than the file being gone: out of open files
// (EMFILE, ENFILE), memory or I/O are the worker's own transient trouble,
// never a reason to drop a report. It returns fs.ErrNotExist when the file
// is gone and ctx's error when ctx ends first.
func (o *Outbox) readEntry(ctx context.Context, conv string, seq int64) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		b, err := os.ReadFile(o.entryPath(conv, seq))
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return b, err
		}
		o.cfg.Metrics.retry()
		if attempt == 0 || attempt%20 == 0 {
			o.log.Warn("read outbox entry; retrying", "conversation", conv, "seq", seq, "attempt", attempt+1, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(o.backoff(attempt)):
		}
	}
}

// backoff is full jitter: a random wait in [0, min(max, min·2^attempt)).
func (o *Outbox) backoff(attempt int) time.Duration {
	d := o.cfg.MaxBackoff
	if attempt < 30 {
		d = min(d, o.cfg.MinBackoff<<attempt)
	}
	return time.Duration(rand.Int64N(int64(d))) + time.Millisecond
}

// bury moves an entry to dead/ (kept for the operator; not retried).
func (o *Outbox) bury(conv string, seq int64) {
	dst := filepath.Join(o.deadDir(), fmt.Sprintf("%s-%020d.json", conv, seq))
	if err := os.Rename(o.entryPath(conv, seq), dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
		o.log.Error("move outbox entry to dead", "conversation", conv, "seq", seq, "err", err)
	}
}

// finish removes a delivered or dropped entry and wakes its waiters.
func (o *Outbox) finish(conv string, seq int64, r Result) {
	if r.Delivered {
		if err := os.Remove(o.entryPath(conv, seq)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			// Left on disk it is sent again after a restart, which the
			// idempotency key makes harmless.
			o.log.Error("remove delivered outbox entry", "conversation", conv, "seq", seq, "err", err)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if l := o.lanes[conv]; l != nil && len(l.seqs) > 0 && l.seqs[0] == seq {
		l.seqs = l.seqs[1:]
		o.entries--
		o.bytes -= l.sizes[seq]
		delete(l.sizes, seq)
	}
	for _, ch := range o.waiters[seq] {
		ch <- r
	}
	delete(o.waiters, seq)
	if o.full && o.entries < o.cfg.MaxEntries {
		o.full = false
		o.log.Info("outbox has room again", "entries", o.entries, "bytes", o.bytes)
	}
	close(o.space)
	o.space = make(chan struct{})
	o.cfg.Metrics.setSize(o.entries, o.bytes)
}
