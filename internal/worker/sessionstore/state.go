package sessionstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/talkide/talkide/internal/worker/atomicfile"
)

// A conversation's state is saved at every message, turn start and turn
// end, so how it is written sets much of what a turn costs. Replacing a
// file (temp file, fsync, rename, fsync of the directory) cost about five
// times an append's fsync in CPU and seven times in time. So the state is
// kept in two slot files written in place, in turn:
//
//   - state.0.json and state.1.json each hold
//     {"seq":N,"crc32c":C,"state":{Meta}}, padded with spaces to the size
//     the file had (so a save changes no file size and fdatasync writes
//     no metadata); save N goes to slot N mod 2, so the slot holding the
//     newest intact state is never the one written;
//   - LoadMeta takes the intact slot with the higher seq: a save cut by a
//     crash leaves its slot torn (its CRC-32C does not match) or old, and
//     the state before that save is read;
//   - state.json is a marker, {"format":2,"conversation_id":...}, written
//     once (atomically) after the first slot: its presence is the
//     conversation's existence (List, RemoveState), and a worker of the
//     earlier format refuses it (ErrFormat) rather than misread it.
//
// A state.json of format 1 holds the whole state (workers before this
// format); it is read as before and moved to slots by the first save.

// StateFormat is the on-disk format of a conversation's state written by
// this store (two slots and a marker, above). LoadMeta also reads format 1.
const StateFormat = 2

const (
	stateMarker = "state.json"
	// slotSlack bounds the padding a slot keeps after its state shrinks:
	// past it (and past the state's own size) the file is truncated.
	slotSlack = 4096
)

var slotCRC = crc32.MakeTable(crc32.Castagnoli)

// slotPos is where a Meta was last loaded from or saved to.
type slotPos struct {
	// seq is the save number of the state read or written (0: none yet).
	seq uint64
	// known is set once seq was read from the slots under a marker of
	// StateFormat (LoadMeta, SaveMeta): the next save then writes seq+1
	// without reading anything first.
	known bool
}

func slotName(seq uint64) string { return fmt.Sprintf("state.%d.json", seq%2) }

// marker is state.json's content; in format 1 it is the whole Meta.
type marker struct {
	Format         int    `json:"format"`
	ConversationID string `json:"conversation_id"`
}

// slotFile is a slot's content.
type slotFile struct {
	Seq    uint64          `json:"seq"`
	CRC32C uint32          `json:"crc32c"`
	State  json.RawMessage `json:"state"`
}

// LoadMeta reads a conversation's state. It returns ErrNotFound when the
// conversation has none, an error wrapping ErrFormat for a marker of an
// unknown format, and an error when a slot cannot be read, neither slot
// holds an intact state, or the state names another conversation.
func (s *Store) LoadMeta(conv string) (*Meta, error) {
	dir := s.Dir(conv)
	b, err := os.ReadFile(filepath.Join(dir, stateMarker))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("load state of %s: %w", conv, err)
	}
	var head marker
	if err := json.Unmarshal(b, &head); err != nil {
		return nil, fmt.Errorf("load state of %s: %w", conv, err)
	}
	var m Meta
	switch head.Format {
	case FormatVersion: // the whole state, as workers before slots wrote it
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("load state of %s: %w", conv, err)
		}
	case StateFormat:
		if head.ConversationID != conv {
			return nil, fmt.Errorf("load state of %s: it names conversation %q", conv, head.ConversationID)
		}
		state, seq, err := readSlots(dir)
		if err != nil {
			return nil, fmt.Errorf("load state of %s: %w", conv, err)
		}
		if err := json.Unmarshal(state, &m); err != nil {
			return nil, fmt.Errorf("load state of %s: slot %d: %w", conv, seq%2, err)
		}
		m.slot = slotPos{seq: seq, known: true}
	default:
		return nil, fmt.Errorf("load state of %s: %w: version %d, want %d or %d", conv, ErrFormat, head.Format, StateFormat, FormatVersion)
	}
	if m.ConversationID != conv {
		// Saved back, it would land in another conversation's directory.
		return nil, fmt.Errorf("load state of %s: it names conversation %q", conv, m.ConversationID)
	}
	return &m, nil
}

// errNotIntact marks a slot that is missing, torn or holds the other
// slot's save: one a save did not complete. Any other failure to read a
// slot (too many open files, EIO, a stale NFS handle) is an error of its
// own: taking the other slot then would load an older state, and its
// next save would overwrite the newest.
var errNotIntact = errors.New("not intact")

// slotReadTries is how often readSlots reads both slots before it calls
// neither intact: a reader racing the owner's saves (a replica, a quota
// count) can find each slot mid-write once.
const slotReadTries = 3

// readSlots returns the newest intact slot's state and seq. It fails when
// a slot cannot be read, or when neither is intact.
func readSlots(dir string) (state []byte, seq uint64, err error) {
	var why []error
	for range slotReadTries {
		why = why[:0]
		for i := range 2 {
			name := slotName(uint64(i))
			f, err := readSlot(filepath.Join(dir, name), i)
			if errors.Is(err, errNotIntact) {
				why = append(why, fmt.Errorf("%s: %w", name, err))
				continue
			}
			if err != nil {
				return nil, 0, err
			}
			if state == nil || f.Seq > seq {
				state, seq = f.State, f.Seq
			}
		}
		if state != nil {
			return state, seq, nil
		}
	}
	return nil, 0, fmt.Errorf("neither state slot is intact (%w)", errors.Join(why...))
}

// readSlot reads and checks slot file i at path. Its error wraps
// errNotIntact when the slot is missing, torn or of the other slot.
func readSlot(path string, i int) (slotFile, error) {
	var f slotFile
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return f, fmt.Errorf("%w: missing", errNotIntact)
	}
	if err != nil {
		return f, err
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("%w: torn: %v", errNotIntact, err)
	}
	if f.Seq == 0 || crc32.Checksum(f.State, slotCRC) != f.CRC32C {
		return f, fmt.Errorf("%w: torn: its checksum does not match", errNotIntact)
	}
	if f.Seq%2 != uint64(i) {
		return f, fmt.Errorf("%w: holds save %d, of the other slot", errNotIntact, f.Seq)
	}
	return f, nil
}

// SaveMeta writes a conversation's state durably: after it returns, a
// crash leaves LoadMeta reading this state; if it fails, LoadMeta reads the
// state of the save before. It fails with an error wrapping ErrNotFound
// once RemoveState took the conversation's state. It also keeps the
// waiting index (waiting.go).
func (s *Store) SaveMeta(m *Meta) error {
	m.Format = StateFormat
	state, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("save state of %s: %w", m.ConversationID, err)
	}
	dir, err := s.ownDir(m.ConversationID)
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if err := s.saveState(m, dir, state); err != nil {
		return fmt.Errorf("save state of %s: %w", m.ConversationID, err)
	}
	return nil
}

func (s *Store) saveState(m *Meta, dir string, state []byte) error {
	pos := m.slot
	if !pos.known {
		// A new conversation, or one loaded from format 1: continue after
		// any intact slot already there (left by a crash before the marker,
		// or by a conversation deleted under the same id), so the new state
		// is the newest and the newest intact slot is not the one written.
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		for i := range 2 {
			f, err := readSlot(filepath.Join(dir, slotName(uint64(i))), i)
			if err == nil {
				pos.seq = max(pos.seq, f.Seq)
			} else if !errors.Is(err, errNotIntact) {
				return err
			}
		}
	} else if _, err := os.Lstat(filepath.Join(dir, stateMarker)); err != nil {
		// The marker went (RemoveState, perhaps of a Delete that failed
		// after it): a slot written now would never be read.
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: its state was removed", ErrNotFound)
		}
		return err
	}
	work := HasWaitingWork(m)
	if work {
		if err := s.markWaiting(m.ConversationID); err != nil {
			return err
		}
	}
	next := pos.seq + 1
	if err := writeSlot(dir, next, state); err != nil {
		return err
	}
	if !pos.known {
		// Replaces a format 1 state.json, if any: from here the slots hold
		// the state.
		b, _ := json.Marshal(marker{Format: StateFormat, ConversationID: m.ConversationID})
		if err := atomicfile.WriteFile(filepath.Join(dir, stateMarker), b, 0o600); err != nil {
			return err
		}
	}
	m.slot = slotPos{seq: next, known: true}
	if !work {
		if err := s.unmarkWaiting(m.ConversationID); err != nil {
			return err
		}
	}
	return nil
}

// writeSlot writes save seq of state over its slot file in dir, in place,
// and syncs its data (and dir, for a new file). A new file that could not
// be written and synced is removed, so the next save creates it again; an
// old one is left torn, which LoadMeta passes over.
func writeSlot(dir string, seq uint64, state []byte) (err error) {
	path := filepath.Join(dir, slotName(seq))
	created := false
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		created = err == nil
	}
	if err != nil {
		return err
	}
	b := fmt.Appendf(nil, `{"seq":%d,"crc32c":%d,"state":`, seq, crc32.Checksum(state, slotCRC))
	b = append(append(b, state...), "}\n"...)
	err = func() error {
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", path)
		}
		shrink := false
		if pad := st.Size() - int64(len(b)); pad > 0 {
			if pad <= max(slotSlack, int64(len(b))) {
				b = append(b, bytes.Repeat([]byte{' '}, int(pad))...)
			} else {
				shrink = true
			}
		}
		if _, err := f.WriteAt(b, 0); err != nil {
			return err
		}
		if shrink {
			if err := f.Truncate(int64(len(b))); err != nil {
				return err
			}
		}
		return syscall.Fdatasync(int(f.Fd()))
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && created {
		err = syncDir(dir)
	}
	if err != nil && created {
		_ = os.Remove(path)
	}
	return err
}
