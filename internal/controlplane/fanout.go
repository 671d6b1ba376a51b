package controlplane

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/sse"
	"github.com/talkide/talkide/internal/workerclient"
)

// The browser streams of one conversation in this process share one
// subscription to the worker's event stream (a feed): it is opened for the
// first viewer, reconnects after the last event it relayed when the worker
// stream breaks, and serializes each event once into a ring of the
// conversation's latest frames. Each viewer has only a cursor into that
// ring and a wake-up signal: it copies out what it has not sent yet and
// writes it to its browser at its own pace. A viewer the ring overtakes
// (one that fell a whole ring behind) is cut (its stream ends with a
// comment saying so) and resumes with Last-Event-ID; it never holds up the
// others. A viewer that joins behind what the ring keeps (a reload after a
// long absence) reads the worker on its own until it has caught up, then
// joins. A feed with no viewer left stays a moment (a reload reconnects at
// once), then closes.

// Fan-out sizes.
const (
	// feedRecent is how many of its latest frames a feed keeps: what a
	// joiner behind it can replay, and how far a viewer may fall behind
	// before it is cut.
	feedRecent = 512
	// viewerBatch is how many frames a viewer copies out at once.
	viewerBatch = 64
	// feedLinger is how long a feed with no viewer stays open.
	feedLinger = 3 * time.Second
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

	mu     sync.Mutex
	byKey  map[string]*feed // guarded by mu
	opened atomic.Int64     // worker subscriptions opened, ever (tests, metrics)
}

func newFeeds(base context.Context, log *slog.Logger, deleted func(context.Context, string, error) bool) *feeds {
	return &feeds{log: log, base: base, deleted: deleted, linger: feedLinger, byKey: map[string]*feed{}}
}

// feed is one conversation's shared worker subscription.
type feed struct {
	fs     *feeds
	key    string
	conv   string
	wc     *workerclient.Client
	cancel context.CancelFunc

	mu sync.Mutex
	// ring holds the latest frames, oldest first from head (a circular
	// buffer of feedRecent once full); guarded by mu.
	ring    []*frame
	head    int
	last    int64 // the highest id relayed (or the feed's start); guarded by mu
	viewers map[*viewer]struct{}
	ended   bool        // the feed stopped: no viewer may join it
	idle    *time.Timer // closes the feed when no viewer is left
}

// viewer is one browser stream on a feed: a cursor into the ring.
type viewer struct {
	// wake is signalled (never blocking) when frames past pos arrive.
	wake chan struct{}
	// gone is closed when the feed cut the viewer (too slow) or ended;
	// why says which.
	gone chan struct{}
	why  string
	pos  int64 // the last id copied out (guarded by the feed's mu)
}

// oldest is the id of the oldest frame f keeps (0 when none); f.mu held.
func (f *feed) oldest() int64 {
	if len(f.ring) == 0 {
		return 0
	}
	return f.ring[f.head].id
}

// next copies out, into buf, up to viewerBatch frames past v's position
// and moves it past them; nothing once v was cut.
func (f *feed) next(v *viewer, buf []*frame) []*frame {
	f.mu.Lock()
	defer f.mu.Unlock()
	buf = buf[:0]
	select {
	case <-v.gone:
		return buf // cut: the ring no longer holds what it has not had
	default:
	}
	n := len(f.ring)
	// The ring is ordered by id from head: find the first past pos.
	i := sort.Search(n, func(i int) bool { return f.ring[(f.head+i)%n].id > v.pos })
	for ; i < n && len(buf) < viewerBatch; i++ {
		buf = append(buf, f.ring[(f.head+i)%n])
	}
	if len(buf) > 0 {
		v.pos = buf[len(buf)-1].id
	}
	return buf
}

// known reports whether key's feed is open and has relayed the event
// after, so a stream resuming there needs no check with the worker (a
// resume point beyond the newest event is the worker's to refuse).
func (fs *feeds) known(key string, after int64) bool {
	fs.mu.Lock()
	f := fs.byKey[key]
	fs.mu.Unlock()
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.ended && after <= f.last
}

// join adds a viewer at position after (the last id it has) to key's feed,
// opening the feed there when none is open (with es, the worker stream
// the caller opened after the same id, or nil; es is closed when another
// feed is open already). It returns the viewer and its feed, or a nil
// viewer when the feed's kept events do not reach back to after: the
// caller then reads the worker on its own and joins again later.
func (fs *feeds) join(key, conv string, wc *workerclient.Client, after int64, es *workerclient.EventStream) (*viewer, *feed) {
	fs.mu.Lock()
	f := fs.byKey[key]
	if f == nil {
		ctx, cancel := context.WithCancel(fs.base)
		f = &feed{fs: fs, key: key, conv: conv, wc: wc, cancel: cancel, last: after, viewers: map[*viewer]struct{}{}}
		fs.byKey[key] = f
		fs.opened.Add(1)
		go f.run(ctx, after, es)
		es = nil
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
	v := &viewer{wake: make(chan struct{}, 1), gone: make(chan struct{}), pos: after}
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

// isEnded reports whether f stopped for good.
func (f *feed) isEnded() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
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
		f.ended = true
		if f.fs.byKey[f.key] == f {
			delete(f.fs.byKey, f.key)
		}
		f.cancel()
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
	f.ended = true
	for v := range f.viewers {
		v.why = why
		close(v.gone)
	}
	clear(f.viewers)
	f.cancel()
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
	f.last = ev.ID
	if len(f.ring) < feedRecent {
		f.ring = append(f.ring, fr)
	} else {
		// The oldest frame goes: a viewer that has not copied it out
		// yet is a whole ring behind, and is cut.
		evicted := f.ring[f.head].id
		f.ring[f.head] = fr
		f.head = (f.head + 1) % feedRecent
		for v := range f.viewers {
			if v.pos < evicted {
				v.why = "this stream fell too far behind; reconnect with Last-Event-ID"
				close(v.gone)
				delete(f.viewers, v)
			}
		}
	}
	for v := range f.viewers {
		select {
		case v.wake <- struct{}{}:
		default: // already signalled
		}
	}
}

// Why followWorker stopped before ctx ended.
var (
	errOutOfFiles = errors.New("this control plane is out of open files")
	errDeleted    = errors.New("the conversation was deleted")
)

// followWorker reads conv's events from its worker after the id after
// and hands each new one to emit, in order and once, until ctx ends or
// emit returns false (then it returns nil). When the stream breaks or
// cannot be opened it reconnects after the last event handed on, waiting
// 200 ms doubling to 3 s between failed opens. It stops with errOutOfFiles
// when this process cannot open a connection, errDeleted when the
// conversation is gone. es, when not nil, is a stream already opened
// after the same id (under another context: it is closed when ctx ends).
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
	for ctx.Err() == nil {
		if es == nil {
			var err error
			es, err = wc.Events(ctx, conv, after)
			switch {
			case err != nil && localExhaustion(err):
				log.Warn("cannot connect to the worker: out of open files", "conversation", conv, "err", err)
				return errOutOfFiles
			case err != nil && ctx.Err() == nil && deleted(ctx, conv, err):
				return errDeleted
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
// when the conversation is deleted or this process is out of open files
// (the viewers reconnect and get the refusal).
func (f *feed) run(ctx context.Context, after int64, es *workerclient.EventStream) {
	err := followWorker(ctx, f.fs.log, f.wc, f.conv, after, es, f.fs.deleted, func(ev contract.Event) bool {
		f.publish(ev)
		return true
	})
	switch {
	case errors.Is(err, errOutOfFiles):
		f.end(err.Error() + "; reconnect")
	case errors.Is(err, errDeleted):
		f.end(err.Error())
	}
}
