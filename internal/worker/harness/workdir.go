package harness

import (
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// This file keeps a conversation's working directory independent of where
// the session volume is mounted (case W3): the state stores it as a name
// under the workspace root (sessionstore.Meta.WorkDirIn), older state is
// migrated on load, and state naming any other directory is refused, so
// the worker never creates or enters a path a state file names outside its
// roots.
//
// The CLI keeps a session's transcript under
// projects/<its first working directory, sanitized>/ and finds it there
// when resumed from another working directory (checked with Claude Code
// 2.1.332: the resumed request holds the whole history, plus a system
// message "# Environment update" giving the new and the old directory), so
// transcripts need no migration; readTranscript looks in every projects/
// folder too. What a move does lose is the CLI's auto-memory: it reads
// MEMORY.md from projects/<new directory>/memory/, while the system prompt
// it recorded in the transcript (a prompt_snapshot record, re-sent on every
// resume) still tells the model to write memories under the old
// CLAUDE_CONFIG_DIR, which the jail does not have. Only stable paths inside
// the jail (the volume bound at a fixed path) would keep that.

// resolveWorkDirLocked sets the session's working directory from its state,
// saving migrated state at once (so the stored state stops naming a path of an
// earlier mount). Refused state leaves workDir empty and workDirErr set:
// the conversation still loads (status, events and Delete work), but no CLI
// starts for it and each of its turns fails with start_failed saying why.
func (s *session) resolveWorkDirLocked() {
	old := s.meta.WorkDir
	dir, changed, err := s.meta.WorkDirIn(s.h.cfg.WorkspaceRoot, s.conv)
	if err != nil {
		s.workDir, s.workDirErr = "", err
		s.h.log.Error("conversation state refused", "conversation", s.conv, "err", err)
		return
	}
	s.workDir, s.workDirErr = dir, nil
	if changed {
		s.h.log.Info("working directory migrated to the workspace root", "conversation", s.conv, "stored", old, "work_dir", dir)
		_ = s.saveLocked()
	}
}

// workDirRefusal is the error a start of a conversation with refused state
// fails with; nil when its working directory is known.
func (s *session) workDirRefusal() error {
	if s.workDirErr == nil {
		return nil
	}
	return &startRefused{msg: "refused to run the agent: the conversation's state names a working directory outside this worker's workspace root", err: s.workDirErr}
}

// startRefused is a start the worker refused on purpose: Msg is safe to
// show the user; the cause (with paths) is for the log.
type startRefused struct {
	msg string
	err error
}

func (e *startRefused) Error() string { return e.msg + " (" + e.err.Error() + ")" }
func (e *startRefused) Unwrap() error { return e.err }

// leftoverTmpDir is the CLAUDE_CODE_TMPDIR by which the leftover processes
// of a crashed CLI process of the conversation are found (killByMarker):
// this worker's tmp dir of the conversation. The path stored in pi is not
// used: after the session volume moved or was restored next to its
// original, it may be another live worker's, whose agent must not be
// killed.
func (s *session) leftoverTmpDir(pi *sessionstore.ProcessInfo) string {
	if pi.TmpDir != "" && pi.TmpDir != s.tmpDir() {
		s.h.log.Info("stored tmp dir of a crashed process is not this worker's; looking for leftovers by this worker's", "conversation", s.conv, "stored", pi.TmpDir, "tmp_dir", s.tmpDir())
	}
	return s.tmpDir()
}
