package sessionstore

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/talkide/talkide/internal/contract"
)

// ErrWorkDir is returned (wrapped) by Meta.WorkDirIn for state whose working
// directory is not the conversation's own.
var ErrWorkDir = errors.New("stored working directory is not the conversation's own")

// WorkDirIn returns the working directory of conversation conv, whose state
// m is, under root (the worker's workspace root, absolute): root/<Workspace>.
// It sets Workspace and WorkDir (to the returned path) as a save should store
// them, and reports changed when either differs from what was loaded: state
// of a worker that predates Workspace, or a session volume mounted at
// another path than when it was saved (a new mount, a restored backup).
//
// State without Workspace is migrated from its absolute WorkDir when that is
// the conversation's own directory under some root, <old root>/<conv>: the
// old root is never looked at, created or entered, since it may not exist
// any more or be someone else's. Anything else is refused with an error
// wrapping ErrWorkDir, and m is left as it was: a Workspace other than conv,
// a WorkDir that is relative, not clean, or another directory than the
// conversation's. So no state file can make the worker create, enter or
// give an agent a directory outside its workspace root or another
// conversation's.
func (m *Meta) WorkDirIn(root, conv string) (dir string, changed bool, err error) {
	if err := contract.ValidConversationID(conv); err != nil {
		return "", false, fmt.Errorf("working directory of %q: %w", conv, err)
	}
	if !filepath.IsAbs(root) || filepath.Clean(root) != root {
		return "", false, fmt.Errorf("working directory of %s: workspace root %q is not an absolute clean path", conv, root)
	}
	switch {
	case m.Workspace == conv:
	case m.Workspace != "":
		return "", false, fmt.Errorf("%w: %s names workspace %q", ErrWorkDir, conv, m.Workspace)
	case m.WorkDir == "":
		// Nothing names a directory: the conversation's own is the only
		// one it can have.
	case !filepath.IsAbs(m.WorkDir) || filepath.Clean(m.WorkDir) != m.WorkDir || filepath.Base(m.WorkDir) != conv:
		return "", false, fmt.Errorf("%w: %s names %q, not <workspace root>/%s", ErrWorkDir, conv, m.WorkDir, conv)
	}
	dir = filepath.Join(root, conv)
	changed = m.Workspace != conv || m.WorkDir != dir
	m.Workspace, m.WorkDir = conv, dir
	return dir, changed, nil
}
