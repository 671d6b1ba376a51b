package sessionstore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/atomicfile"
)

// logHeader is the first line of events.jsonl.
type logHeader struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
}

const logFormatName = "talkide-eventlog"

// RepairReport says what Open found wrong with an event log file and fixed.
type RepairReport struct {
	// TornBytes is the size of an incomplete last record that was cut off.
	TornBytes int64
	// BadRecords counts undecodable records inside the file, skipped.
	BadRecords int
}

// EventLog is one conversation's append-only event log. Append assigns the
// next sequence id and writes the event durably (fsync) before returning, so
// anything streamed from the log was stored first. A writer with several
// events at hand may Write them as they come and Commit them with one write
// and one sync; they reach the file, and readers, only then. It is safe for
// concurrent use.
type EventLog struct {
	path string
	conv string
	// recentCap bounds recent (Store.RecentEvents).
	recentCap int

	mu sync.Mutex
	// f is the log file opened for appending; guarded by mu.
	f *os.File
	// lastID is the id of the newest event; guarded by mu.
	lastID int64
	// recent holds the newest events (at most recentCap), oldest first; guarded by mu.
	recent []contract.Event
	// changed is closed and replaced on every append; guarded by mu.
	changed chan struct{}
	// closed is set by Close; guarded by mu.
	closed bool
	// readOnly is set for logs opened with OpenEventLogReader.
	readOnly bool
	// keep is the retention bound (0: none); count the events in the file;
	// guarded by mu.
	keep, count int
	// pending are events given to Write and not yet committed, pendingBuf
	// their encoded lines; guarded by mu.
	pending    []contract.Event
	pendingBuf []byte
}

// ErrClosed is returned by Append on a closed log.
var ErrClosed = errors.New("event log closed")

// ErrReadOnly is returned by Append on a log opened with OpenEventLogReader.
var ErrReadOnly = errors.New("event log opened read-only")

// OpenEventLog opens (or creates) the event log of conversation conv,
// repairing a torn last record. The report tells what was repaired.
func (s *Store) OpenEventLog(conv string) (*EventLog, RepairReport, error) {
	dir := s.Dir(conv)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, RepairReport{}, fmt.Errorf("open event log of %s: %w", conv, err)
	}
	l := &EventLog{path: filepath.Join(dir, "events.jsonl"), conv: conv, changed: make(chan struct{}), keep: s.KeepEvents, recentCap: s.RecentEvents}
	if l.recentCap <= 0 {
		l.recentCap = DefaultRecentEvents
	}
	rep, err := l.load()
	if err != nil {
		return nil, rep, fmt.Errorf("open event log of %s: %w", conv, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.compactLocked(); err != nil {
		l.f.Close()
		return nil, rep, fmt.Errorf("open event log of %s: %w", conv, err)
	}
	return l, rep, nil
}

// OpenEventLogReader opens conv's event log for reading only, as a process
// that does not own the conversation may: nothing is created, repaired or
// written, and an incomplete last record is ignored. Appends by the owner
// after opening are seen by Since (from the file) but do not wake Follow.
// It returns ErrNotFound when the conversation has no log.
func (s *Store) OpenEventLogReader(conv string) (*EventLog, error) {
	l := &EventLog{path: filepath.Join(s.Dir(conv), "events.jsonl"), conv: conv, changed: make(chan struct{}), readOnly: true}
	if _, err := os.Stat(l.path); errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotFound
	}
	l.lastID = math.MaxInt64 // Since always consults the file; LastID means nothing here
	return l, nil
}

func (l *EventLog) load() (RepairReport, error) {
	var rep RepairReport
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return rep, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return rep, err
	}
	if st.Size() == 0 {
		h, _ := json.Marshal(logHeader{Format: logFormatName, Version: FormatVersion})
		if _, err := f.Write(append(h, '\n')); err != nil {
			f.Close()
			return rep, err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return rep, err
		}
		if err := syncDir(filepath.Dir(l.path)); err != nil {
			f.Close()
			return rep, err
		}
		l.f = f
		return rep, nil
	}
	br := bufio.NewReader(f)
	var good int64 // offset after the last complete, decodable record
	first := true
	for {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			if len(line) > 0 {
				rep.TornBytes = int64(len(line))
			}
			break
		}
		if err != nil {
			f.Close()
			return rep, err
		}
		if first {
			first = false
			var h logHeader
			if json.Unmarshal(line, &h) != nil || h.Format != logFormatName {
				f.Close()
				return rep, fmt.Errorf("%w: not an event log", ErrFormat)
			}
			if h.Version != FormatVersion {
				f.Close()
				return rep, fmt.Errorf("%w: event log version %d, want %d", ErrFormat, h.Version, FormatVersion)
			}
			good += int64(len(line))
			continue
		}
		var ev contract.Event
		if err := json.Unmarshal(line, &ev); err != nil || ev.ID <= l.lastID {
			rep.BadRecords++
			good += int64(len(line))
			continue
		}
		good += int64(len(line))
		l.lastID = ev.ID
		l.count++
		l.remember(ev)
	}
	if rep.TornBytes > 0 {
		if err := f.Truncate(good); err != nil {
			f.Close()
			return rep, err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return rep, err
		}
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return rep, err
	}
	l.f = f
	return rep, nil
}

func (l *EventLog) remember(ev contract.Event) {
	if len(l.recent) == l.recentCap {
		copy(l.recent, l.recent[1:])
		l.recent = l.recent[:l.recentCap-1]
	}
	l.recent = append(l.recent, ev)
}

// Append assigns ev the next id, writes it durably and wakes readers. It
// returns the stored event. On a write error nothing is published and the id
// is not used.
func (l *EventLog) Append(ev contract.Event) (contract.Event, error) {
	evs, err := l.AppendAll([]contract.Event{ev})
	if err != nil {
		return contract.Event{}, err
	}
	return evs[len(evs)-1], nil // after any Write kept before it
}

// AppendAll appends evs as Append does, in order under consecutive ids,
// with one write and one sync. Events given to Write before are stored and
// published with them, ahead of them. On an error none of them is stored or
// published (those given to Write are dropped too) and no id is used; a
// crash during the write may keep a prefix of them (the torn record after
// it is cut when the log is next opened). It returns the stored events,
// Write's first.
func (l *EventLog) AppendAll(evs []contract.Event) ([]contract.Event, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.writeLocked(evs); err != nil {
		return nil, err
	}
	stored, err := l.commitLocked()
	if err != nil {
		return nil, err
	}
	return stored, nil
}

// Write gives evs their ids (the next ones, after the events given before
// and not yet committed) and keeps them, encoded, for Commit: a writer with
// more events at hand stores them all with one write and one sync (group
// commit). Nothing reaches the file before Commit, so no reader, in this
// process or another, sees them before they are stored. It returns the
// events with their ids; on an error (an event that cannot be encoded, a
// closed log) none of evs is kept and no id is used.
func (l *EventLog) Write(evs []contract.Event) ([]contract.Event, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writeLocked(evs)
}

// Pending is how many events Write keeps for Commit.
func (l *EventLog) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending)
}

// Commit writes the events Write kept, syncs them and publishes them to
// readers. It returns them (none when nothing was kept). On an error it
// returns them with the error: none is stored (a partial write is cut
// off) and none of their ids is used.
func (l *EventLog) Commit() ([]contract.Event, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.commitLocked()
}

// Discard drops the events Write kept, unstored and their ids unused, and
// returns them (for a writer that lost the right to write the log).
func (l *EventLog) Discard() []contract.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	evs := l.pending
	l.resetPendingLocked()
	return evs
}

// resetPendingLocked forgets what Write kept, keeping the encoding buffer
// for the next events unless a burst made it large.
func (l *EventLog) resetPendingLocked() {
	l.pending, l.pendingBuf = nil, l.pendingBuf[:0]
	if cap(l.pendingBuf) > maxKeptBuffer {
		l.pendingBuf = nil
	}
}

func (l *EventLog) writeLocked(evs []contract.Event) ([]contract.Event, error) {
	if l.readOnly {
		return nil, ErrReadOnly
	}
	if l.closed {
		return nil, ErrClosed
	}
	next := l.lastID + int64(len(l.pending)) + 1
	stored := make([]contract.Event, len(evs))
	b := l.pendingBuf
	for i, ev := range evs {
		ev.ID = next + int64(i)
		ev.ConversationID = l.conv
		line, err := json.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("append event: %w", err)
		}
		b = append(append(b, line...), '\n')
		stored[i] = ev
	}
	l.pendingBuf = b
	l.pending = append(l.pending, stored...)
	return stored, nil
}

func (l *EventLog) commitLocked() ([]contract.Event, error) {
	if len(l.pending) == 0 {
		return nil, nil
	}
	evs, b := l.pending, l.pendingBuf
	l.resetPendingLocked()
	off, err := l.f.Seek(0, io.SeekCurrent)
	if err != nil {
		return evs, fmt.Errorf("append event: %w", err)
	}
	if _, err := l.f.Write(b); err != nil {
		l.cutLocked(off) // drop a partial record so the log stays well-formed
		return evs, fmt.Errorf("append event: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		l.cutLocked(off)
		return evs, fmt.Errorf("append event: %w", err)
	}
	for _, ev := range evs {
		l.lastID = ev.ID
		l.count++
		l.remember(ev)
	}
	close(l.changed)
	l.changed = make(chan struct{})
	// A failed trimming leaves the events stored; it is tried again at the
	// next append.
	_ = l.compactLocked()
	return evs, nil
}

// maxKeptBuffer bounds the encoding buffer a log keeps between commits
// (a larger one, from a burst of big events, is let go).
const maxKeptBuffer = 256 << 10

// cutLocked truncates the file at off, where the next record goes.
func (l *EventLog) cutLocked(off int64) {
	_ = l.f.Truncate(off)
	_, _ = l.f.Seek(off, io.SeekStart)
}

// compactLocked drops the oldest events when the log holds more than 1.5
// times its bound: the newest keep events are written to a new file that
// atomically replaces the log. Readers that asked for older events get the
// oldest kept one first (they see the gap in the ids).
func (l *EventLog) compactLocked() error {
	if l.keep <= 0 || l.count <= l.keep+l.keep/2 {
		return nil
	}
	evs, err := l.readFile(l.lastID-int64(l.keep), l.keep, l.lastID)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	h, _ := json.Marshal(logHeader{Format: logFormatName, Version: FormatVersion})
	b.Write(h)
	b.WriteByte('\n')
	for _, ev := range evs {
		line, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	if err := atomicfile.WriteFile(l.path, b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("compact event log: %w", err)
	}
	f, err := os.OpenFile(l.path, os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("compact event log: %w", err)
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return err
	}
	l.f.Close()
	l.f = f
	l.count = len(evs)
	return nil
}

// LastID returns the id of the newest event (0 when empty).
func (l *EventLog) LastID() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastID
}

// changedOrClosed returns the channel closed at the next Append (or Close)
// and whether the log is closed. Take it before calling Since so no append
// is missed between the two.
func (l *EventLog) changedOrClosed() (<-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed, l.closed
}

// followBatch is how many events Follow reads at a time.
const followBatch = 256

// Follow calls onEvent for every event with id > after, in order, then for
// each new event as it is appended, until ctx ends (it returns ctx.Err()),
// onEvent or onIdle fails (it returns that error) or the log is closed (it
// returns ErrClosed after delivering every stored event). When no event
// arrives for heartbeat (if > 0), it calls onIdle. Each follower reads at its
// own pace, so a slow one delays nobody else.
func (l *EventLog) Follow(ctx context.Context, after int64, heartbeat time.Duration, onEvent func(contract.Event) error, onIdle func() error) error {
	var tick <-chan time.Time
	if heartbeat > 0 {
		t := time.NewTicker(heartbeat)
		defer t.Stop()
		tick = t.C
	}
	for {
		changed, closed := l.changedOrClosed()
		evs, err := l.Since(after, followBatch)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			if err := onEvent(ev); err != nil {
				return err
			}
			after = ev.ID
		}
		if len(evs) == followBatch {
			continue
		}
		if closed {
			return ErrClosed
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-tick:
			if onIdle != nil {
				if err := onIdle(); err != nil {
					return err
				}
			}
		}
	}
}

// Since returns up to max events with id > after, oldest first, from memory
// when possible, else from the file.
func (l *EventLog) Since(after int64, max int) ([]contract.Event, error) {
	l.mu.Lock()
	last := l.lastID
	if after >= last {
		l.mu.Unlock()
		return nil, nil
	}
	if len(l.recent) > 0 && after >= l.recent[0].ID-1 {
		start := int(after - (l.recent[0].ID - 1))
		end := min(start+max, len(l.recent))
		out := append([]contract.Event(nil), l.recent[start:end]...)
		l.mu.Unlock()
		return out, nil
	}
	l.mu.Unlock()
	return l.readFile(after, max, last)
}

// readFile reads up to max events with after < id <= last from the file
// (last keeps out a record being appended, not yet synced).
func (l *EventLog) readFile(after int64, max int, last int64) ([]contract.Event, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, fmt.Errorf("read event log: %w", err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var out []contract.Event
	first := true
	for len(out) < max {
		line, err := br.ReadBytes('\n')
		if err != nil {
			break // EOF, or a record being appended right now
		}
		if first {
			first = false
			continue
		}
		// Cheap skip of old records before decoding.
		if !bytes.Contains(line, []byte(`"id":`)) {
			continue
		}
		var ev contract.Event
		if json.Unmarshal(line, &ev) != nil || ev.ID <= after {
			continue
		}
		if ev.ID > last {
			break
		}
		out = append(out, ev)
	}
	return out, nil
}

// Close commits what Write left pending, closes the file and wakes
// readers; later Appends fail with ErrClosed.
func (l *EventLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	var err error
	if l.f != nil {
		_, err = l.commitLocked()
	}
	l.closed = true
	close(l.changed) // stays closed: readers see the end through Follow
	if l.f == nil {
		return nil
	}
	return errors.Join(err, l.f.Close())
}
