package controlplane

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/workerclient"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/sse"
)

// The browser streams of one conversation in this process share one
// subscription to the worker's event stream (a feed): it is opened for the
// first viewer, reconnects after the last event it relayed when the worker
// stream breaks, and serializes each event once into a ring of the
// conversation's latest frames. Each viewer has only a cursor into that
// ring and a wake-up signal: it copies out what it has not sent yet and
// writes it to its browser at its own pace. A viewer the ring overtakes
// (one that fell a whole ring behind) gets a moment (feedGrace) to move
// on, then is cut (its stream ends with a comment saying so) and resumes
// with Last-Event-ID; it holds up the others that moment at most. A viewer
// that joins behind what the ring keeps (a reload after a long absence)
// reads the worker on its own until it has caught up, then joins. A feed with no viewer left stays a moment (a reload reconnects at
// once), then closes.

// Fan-out sizes.
const (
	// feedRecent and feedRecentBytes bound what a feed keeps of its
	// latest frames, in number and in bytes (the newest is kept whatever
	// its size): what a joiner behind it can replay, and how far a viewer
	// may fall behind before it is cut.
	feedRecent      = 512
	feedRecentBytes = 4 << 20
	// viewerBatch is how many frames a viewer copies out at once.
	viewerBatch = 64
	// feedLinger is how long a feed with no viewer stays open.
	feedLinger = 3 * time.Second
	// feedGrace is how long a feed waits, when its ring is full, for a
	// viewer a whole ring behind before cutting it: the most a slow
	// browser holds up the others, once.
	feedGrace = 100 * time.Millisecond
)

// frame is one event as it goes on the wire to every viewer.
type frame struct {
	id    int64
	bytes []byte
}

// feeds are the process's feeds by tenant, env and conversation.
type feeds struct {
	log *slog.Logger
	// base ends every feed (BeginShutdown).
	base context.Context
	// deleted reports whether a worker's error means the conversation is
	// gone (Server.deletedMeanwhile).
	deleted func(ctx context.Context, conv string, err error) bool
	linger  time.Duration
	// slots is the cap shared with the browser streams: each open feed
	// holds one.
	slots *streamSlots

	mu     sync.Mutex
	byKey  map[string]*feed // guarded by mu
	opened atomic.Int64     // worker subscriptions opened, ever (tests, metrics)
}

func newFeeds(base context.Context, log *slog.Logger, deleted func(context.Context, string, error) bool, slots *streamSlots) *feeds {
	return &feeds{log: log, base: base, deleted: deleted, linger: feedLinger, slots: slots, byKey: map[string]*feed{}}
}

// feed is one conversation's shared worker subscription.
type feed struct {
	fs     *feeds
	key    string
	conv   string
	wc     *workerclient.Client
	cancel context.CancelFunc

	mu sync.RWMutex
	// ring holds the latest frames, oldest first, at most feedRecent of
	// them and feedRecentBytes (ringBytes counts them); guarded by mu.
	ring      []*frame
	ringBytes int
	last      int64 // the highest id relayed (or the feed's start); guarded by mu
	viewers   map[*viewer]struct{}
	// moved is signalled (never blocking) when a viewer copies frames
	// out: a publish waiting for one a ring behind looks again.
	moved chan struct{}
	ended bool        // the feed stopped: no viewer may join it
	idle  *time.Timer // closes the feed when no viewer is left
}

// viewer is one browser stream on a feed: a cursor into the ring.
type viewer struct {
	// wake is signalled (never blocking) when frames past pos arrive.
	wake chan struct{}
	// gone is closed when the feed cut the viewer (too slow) or ended;
	// why says which.
	gone chan struct{}
	why  string
	// pos is the last id copied out: written by the viewer's own
	// goroutine under the feed's read lock, read by publish under its
	// write lock.
	pos atomic.Int64
}

// oldest is the id of the oldest frame f keeps (0 when none); f.mu held.
func (f *feed) oldest() int64 {
	if len(f.ring) == 0 {
		return 0
	}
	return f.ring[0].id
}

// next copies out, into buf, up to viewerBatch frames past v's position
// and moves it past them; nothing once v was cut.
func (f *feed) next(v *viewer, buf []*frame) []*frame {
	// A read lock: every viewer of a conversation copies out the same
	// frames at once when one arrives (thousands, for a popular one).
	f.mu.RLock()
	defer f.mu.RUnlock()
	buf = buf[:0]
	select {
	case <-v.gone:
		return buf // cut: the ring no longer holds what it has not had
	default:
	}
	// The ring is ordered by id: find the first past pos.
	pos := v.pos.Load()
	i := sort.Search(len(f.ring), func(i int) bool { return f.ring[i].id > pos })
	buf = append(buf, f.ring[i:min(i+viewerBatch, len(f.ring))]...)
	if len(buf) > 0 {
		v.pos.Store(buf[len(buf)-1].id)
		select {
		case f.moved <- struct{}{}:
		default:
		}
	}
	return buf
}

// lookup reports whether key has a feed open now and whether it has
// relayed the event after, so a stream resuming there needs no check with
// the worker (a resume point beyond the newest event is the worker's to
// refuse).
func (fs *feeds) lookup(key string, after int64) (open, relayed bool) {
	fs.mu.Lock()
	f := fs.byKey[key]
	fs.mu.Unlock()
	if f == nil {
		return false, false
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	return !f.ended, !f.ended && after <= f.last
}

// join adds a viewer at position after (the last id it has) to key's feed,
// opening the feed there when none is open (with es, the worker stream
// the caller opened after the same id, or nil; es is closed when another
// feed is open already). A feed opened holds a slot: the one the caller
// reserved (reserved true; given back when a feed was open already) or
// one taken now. It returns the viewer and its feed; a nil viewer when the
// feed's kept events do not reach back to after (the caller then reads
// the worker on its own and joins again later); and a nil feed as well
// when no slot was free for a feed.
func (fs *feeds) join(key, conv string, wc *workerclient.Client, after int64, es *workerclient.EventStream, reserved bool) (*viewer, *feed) {
	fs.mu.Lock()
	f := fs.byKey[key]
	switch {
	case f == nil && !reserved && !fs.slots.take(1):
		fs.mu.Unlock()
		if es != nil {
			es.Close()
		}
		return nil, nil
	case f == nil:
		ctx, cancel := context.WithCancel(fs.base)
		f = &feed{fs: fs, key: key, conv: conv, wc: wc, cancel: cancel, last: after, viewers: map[*viewer]struct{}{}, moved: make(chan struct{}, 1)}
		fs.byKey[key] = f
		fs.opened.Add(1)
		go f.run(ctx, after, es)
		es = nil
	case reserved:
		fs.slots.give(1)
	}
	fs.mu.Unlock()
	if es != nil {
		es.Close()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		return nil, f
	}
	if after < f.last && (len(f.ring) == 0 || f.oldest() > after+1) {
		return nil, f
	}
	v := &viewer{wake: make(chan struct{}, 1), gone: make(chan struct{})}
	v.pos.Store(after)
	if after < f.last {
		v.wake <- struct{}{} // frames to replay
	}
	f.viewers[v] = struct{}{}
	if f.idle != nil {
		f.idle.Stop()
		f.idle = nil
	}
	return v, f
}

// stop marks f ended, gives its slot back and ends its worker stream, once;
// f.mu held.
func (f *feed) stop() {
	if f.ended {
		return
	}
	f.ended = true
	f.fs.slots.give(1)
	f.cancel()
}

// isEnded reports whether f stopped for good.
func (f *feed) isEnded() bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.ended
}

// leave removes v from f; the last viewer to leave starts the linger.
func (f *feed) leave(v *viewer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.viewers, v)
	if len(f.viewers) > 0 || f.ended || f.idle != nil {
		return
	}
	f.idle = time.AfterFunc(f.fs.linger, func() {
		f.fs.mu.Lock()
		defer f.fs.mu.Unlock()
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.viewers) > 0 || f.ended {
			return
		}
		if f.fs.byKey[f.key] == f {
			delete(f.fs.byKey, f.key)
		}
		f.stop()
	})
}

// end stops f for good: it is taken out of the map (a later viewer opens a
// new feed) and every viewer's stream ends with why.
func (f *feed) end(why string) {
	f.fs.mu.Lock()
	if f.fs.byKey[f.key] == f {
		delete(f.fs.byKey, f.key)
	}
	f.fs.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stop()
	for v := range f.viewers {
		v.why = why
		close(v.gone)
	}
	clear(f.viewers)
}

// publish serializes ev once into the ring and wakes every viewer; a
// viewer still before the frame the ring drops is cut. Events at or
// before the last one relayed are dropped (never relayed twice).
func (f *feed) publish(ev contract.Event) {
	b, err := sse.JSONFrame(strconv.FormatInt(ev.ID, 10), string(ev.Type), ev)
	if err != nil {
		f.fs.log.Warn("worker event not relayed: it cannot be framed", "conversation", f.conv, "id", ev.ID, "err", err)
		return
	}
	fr := &frame{id: ev.ID, bytes: b}
	f.mu.Lock()
	defer f.mu.Unlock()
	if ev.ID <= f.last {
		return
	}
	// The oldest frames go while the ring is over its bounds with the new
	// one. A viewer that has not copied them out yet is a whole ring
	// behind: it gets feedGrace to move on (it may only not have been
	// scheduled while a burst came in, such as a long history replayed to
	// the first viewer), then is cut.
	if drop := f.overflow(len(b)); drop > 0 {
		if f.lagging(f.ring[drop-1].id) {
			grace := time.NewTimer(feedGrace)
			for waiting := true; waiting && f.lagging(f.ring[drop-1].id); {
				f.mu.Unlock()
				select {
				case <-f.moved:
				case <-grace.C:
					waiting = false // cut who still lags
				}
				f.mu.Lock()
			}
			grace.Stop()
		}
		evicted := f.ring[drop-1].id
		for _, old := range f.ring[:drop] {
			f.ringBytes -= len(old.bytes)
		}
		clear(f.ring[:drop])
		f.ring = f.ring[drop:]
		for v := range f.viewers {
			if v.pos.Load() < evicted {
				v.why = "this stream fell too far behind; reconnect with Last-Event-ID"
				close(v.gone)
				delete(f.viewers, v)
			}
		}
	}
	if len(f.ring) == cap(f.ring) {
		// The kept frames move to a new array of at most twice the
		// bound, so the start's advance does not grow one for ever.
		f.ring = append(make([]*frame, 0, min(max(2*len(f.ring), 16), 2*feedRecent)), f.ring...)
	}
	f.ring = append(f.ring, fr)
	f.ringBytes += len(b)
	f.last = ev.ID
	for v := range f.viewers {
		select {
		case v.wake <- struct{}{}:
		default: // already signalled
		}
	}
}

// overflow returns how many of the oldest frames must go for one of n
// bytes to fit; f.mu held.
func (f *feed) overflow(n int) int {
	drop, count, bytes := 0, len(f.ring)+1, f.ringBytes+n
	for drop < len(f.ring) && (count > feedRecent || bytes > feedRecentBytes) {
		count--
		bytes -= len(f.ring[drop].bytes)
		drop++
	}
	return drop
}

// lagging reports whether a viewer has not yet copied out the frame id;
// f.mu held.
func (f *feed) lagging(id int64) bool {
	for v := range f.viewers {
		if v.pos.Load() < id {
			return true
		}
	}
	return false
}

// Why followWorker stopped before ctx ended.
var (
	errOutOfFiles = errors.New("this control plane is out of open files")
	errDeleted    = errors.New("the conversation was deleted")
	errBadResume  = errors.New("the resume point (Last-Event-ID) is beyond this conversation's newest event")
)

// followWorker reads conv's events from its worker after the id after
// and hands each new one to emit, in order and once, until ctx ends or
// emit returns false (then it returns nil). When the stream breaks or
// cannot be opened it reconnects after the last event handed on, waiting
// 200 ms doubling to 3 s between failed opens. It stops with errOutOfFiles
// when this process cannot open a connection, errDeleted when the
// conversation is gone, errBadResume when the worker refuses after. es,
// when not nil, is a stream already opened after the same id (under
// another context: it is closed when ctx ends).
func followWorker(ctx context.Context, log *slog.Logger, wc *workerclient.Client, conv string, after int64, es *workerclient.EventStream,
	deleted func(context.Context, string, error) bool, emit func(contract.Event) bool) error {
	if es != nil {
		first := es
		defer context.AfterFunc(ctx, func() { first.Close() })()
	}
	defer func() {
		if es != nil {
			es.Close()
		}
	}()
	delay := 200 * time.Millisecond
	var we *workerclient.Error
	for ctx.Err() == nil {
		if es == nil {
			var err error
			es, err = wc.Events(ctx, conv, after)
			switch {
			case err != nil && httpapi.LocalExhaustion(err):
				log.Warn("cannot connect to the worker: out of open files", "conversation", conv, "err", err)
				return errOutOfFiles
			case err != nil && ctx.Err() == nil && deleted(ctx, conv, err):
				return errDeleted
			case errors.As(err, &we) && we.Status == http.StatusBadRequest:
				// The worker refuses the resume point (beyond its newest
				// event): one nobody checked, taken while the worker
				// was unreachable or had no session yet. Retrying cannot
				// mend it.
				log.Info("worker refused the resume point", "conversation", conv, "after", after, "err", err)
				return errBadResume
			case err != nil:
				select {
				case <-ctx.Done():
				case <-time.After(delay):
				}
				delay = min(delay*2, 3*time.Second)
				continue
			}
			delay = 200 * time.Millisecond
		}
		ev, err := es.Next()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, io.EOF) {
				log.Info("worker event stream broke; reconnecting", "conversation", conv, "after", after, "err", err)
			}
			es.Close()
			es = nil
			continue
		}
		if ev.ID <= after {
			continue
		}
		after = ev.ID
		if !emit(ev) {
			return nil
		}
	}
	return nil
}

// run relays conv's worker events into f until ctx ends; it ends the feed
// when followWorker stops for good (the conversation deleted, this process
// out of open files, the resume point refused): its viewers reconnect and
// get the refusal.
func (f *feed) run(ctx context.Context, after int64, es *workerclient.EventStream) {
	err := followWorker(ctx, f.fs.log, f.wc, f.conv, after, es, f.fs.deleted, func(ev contract.Event) bool {
		f.publish(ev)
		return true
	})
	switch {
	case errors.Is(err, errOutOfFiles):
		f.end(err.Error() + "; reconnect")
	case err != nil:
		f.end(err.Error())
	}
}
