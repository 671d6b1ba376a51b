package sessionstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// The waiting index holds one empty file, <root>/waiting/<conversation id>,
// per conversation whose stored state has waiting work: queued messages, a
// running turn or a CLI process (HasWaitingWork). Replicas look for work
// to take over in it (ListWaiting) instead of reading every conversation's
// state: with 100,000 conversations that read took most of an idle
// worker's CPU.
//
// A marker is created (and its directory fsynced) before a state with work
// is written and removed after a state without work is written, so a state
// with work always has its marker, also after a crash; a marker can outlive
// its work (a crash between the two), which readers find out from the state.

// HasWaitingWork reports whether m has work a replica must carry on.
func HasWaitingWork(m *Meta) bool {
	return len(m.Pending) > 0 || m.Turn != nil || m.Process != nil
}

func (s *Store) waitingDir() string { return filepath.Join(s.root, "waiting") }

// markWaiting creates conv's marker, durably, unless it exists.
func (s *Store) markWaiting(conv string) error {
	f, err := os.OpenFile(filepath.Join(s.waitingDir(), conv), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		// A store opened before the index existed.
		if err := os.MkdirAll(s.waitingDir(), 0o700); err != nil {
			return err
		}
		f, err = os.OpenFile(filepath.Join(s.waitingDir(), conv), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	}
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return syncDir(s.waitingDir())
}

// unmarkWaiting removes conv's marker, if any.
func (s *Store) unmarkWaiting(conv string) error {
	if err := os.Remove(filepath.Join(s.waitingDir(), conv)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// ListWaiting returns the conversations marked as having waiting work (see
// above): every conversation whose state has work, and perhaps a few whose
// work ended in a crash. Conversations stored before the index existed are
// not in it; List finds them.
func (s *Store) ListWaiting() ([]string, error) {
	entries, err := os.ReadDir(s.waitingDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list conversations with waiting work: %w", err)
	}
	ids := make([]string, 0, len(entries))
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	return ids, nil
}
