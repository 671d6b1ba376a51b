package sessionstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Delete removes a conversation's state and event log. The state file goes
// first (durably), so from then on the conversation does not exist for
// LoadMeta and List even if the rest of its directory outlives a crash; the
// rest is then removed. Close the conversation's event log before. A
// conversation that does not exist is no error.
func (s *Store) Delete(conv string) error {
	if err := s.RemoveState(conv); err != nil {
		return err
	}
	if err := os.RemoveAll(s.Dir(conv)); err != nil {
		return fmt.Errorf("delete conversation %s: %w", conv, err)
	}
	return nil
}

// RemoveState removes a conversation's state file, durably: from then on
// LoadMeta answers ErrNotFound and List leaves it out, while its event log
// can still be closed before Delete removes the rest. A conversation
// without state is no error.
func (s *Store) RemoveState(conv string) error {
	dir, err := s.ownDir(conv)
	if err != nil {
		return fmt.Errorf("delete conversation: %w", err)
	}
	if err := os.Remove(filepath.Join(dir, stateMarker)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete conversation %s: %w", conv, err)
	}
	if err := syncDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete conversation %s: %w", conv, err)
	}
	// Without its marker the slots are never read; removed too, so a
	// conversation created again under this id starts from nothing.
	for i := range 2 {
		if err := os.Remove(filepath.Join(dir, slotName(uint64(i)))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("delete conversation %s: %w", conv, err)
		}
	}
	if err := s.unmarkWaiting(conv); err != nil {
		return fmt.Errorf("delete conversation %s: %w", conv, err)
	}
	if err := s.removeBuildsOf(conv); err != nil {
		return fmt.Errorf("delete conversation %s: %w", conv, err)
	}
	return nil
}
