package harness

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/agentfs"
	"github.com/talkide/talkide/internal/worker/mcppolicy"
)

// This file reads what the worker needs from the agent's own directories
// before a CLI process starts: the session's transcript (to resume or not,
// and the CLI's cumulative cost) and the project's .mcp.json. The agent can
// put anything there (a symlink to a root-only file or a FIFO, a device, a
// hard link, a huge sparse file), so every read goes through agentfs: no
// symlink in any component, non-blocking, a regular file of the agent's,
// bounded. It happens in pumpLocked before the session takes a process
// slot, under the session's own lock only, so even a slow read holds up no
// other conversation.

const (
	// maxProjects bounds the entries of <config>/projects looked at.
	maxProjects = 4096
	// transcriptHead bounds the scan for the first assistant record;
	// transcriptTail is how much of the end is read for the last
	// cost-state record. Memory stays at one 64 KiB buffer whatever the
	// transcript's size.
	transcriptHead = 64 << 20
	transcriptTail = 16 << 20
)

// agentFiles is what a CLI start needs from the agent's files.
type agentFiles struct {
	// sessionID is the session the transcript was looked up for.
	sessionID string
	// transcript: found is set when a file stands where the transcript
	// would be; hasTurn when it holds an assistant record; cost is the
	// totalCostUSD of its last cost-state record; err is set when that file
	// was refused (then found is set and hasTurn is not).
	found, hasTurn bool
	cost           float64
	transcriptErr  error
	// mcpDoc is the project's .mcp.json, nil when there is none; mcpErr is
	// set when one exists but was refused.
	mcpDoc []byte
	mcpErr error
}

// fileOwnerLocked is the uid the agent's files must belong to.
func (s *session) fileOwnerLocked() int {
	if u := s.agentUser(); u != nil {
		return int(u.UID)
	}
	return os.Geteuid()
}

// prepareStartLocked reads the agent's files for the next CLI start unless
// they were read for the current session id already.
func (s *session) prepareStartLocked() {
	if s.files != nil && s.files.sessionID == s.meta.SessionID {
		return
	}
	uid := s.fileOwnerLocked()
	f := &agentFiles{sessionID: s.meta.SessionID}
	f.found, f.hasTurn, f.cost, f.transcriptErr = readTranscript(s.h.cfg.ConfigDir, s.conv, s.meta.SessionID, uid)
	if f.transcriptErr != nil {
		s.h.log.Warn("transcript refused", "conversation", s.conv, "session", s.meta.SessionID, "category", agentfs.Category(f.transcriptErr))
	}
	if s.h.cfg.MCP != nil && s.workDir != "" {
		// Beneath the workspace root, the worker's: the working directory
		// itself is resolved with no symlink either.
		f.mcpDoc, f.mcpErr = agentfs.ReadFile(s.h.cfg.WorkspaceRoot, filepath.Base(s.workDir)+"/.mcp.json",
			agentfs.Limits{MaxBytes: mcppolicy.MaxFileBytes, UID: uid})
		switch {
		case errors.Is(f.mcpErr, fs.ErrNotExist):
			f.mcpDoc, f.mcpErr = nil, nil
		case f.mcpErr != nil:
			f.mcpDoc = nil
			s.h.log.Warn("project .mcp.json refused", "conversation", s.conv, "category", agentfs.Category(f.mcpErr))
		}
	}
	s.files = f
}

// filesLocked returns what prepareStartLocked read (reading it now if it
// did not run).
func (s *session) filesLocked() *agentFiles {
	s.prepareStartLocked()
	return s.files
}

// transcriptRefusedLocked tells the user why the conversation goes on
// without its history. The message is fixed: it never quotes the file.
func (s *session) transcriptRefusedLocked() {
	s.emitLocked(contract.EventError, contract.ErrorEvent{Code: "transcript_refused",
		Message: "the session's transcript is not a regular file of the agent's (a link, a FIFO, a device or another user's file); the conversation goes on in a fresh session without its history"})
}

// readTranscript finds the transcript of sessionID under
// <configRoot>/<conv>/projects/*/<sessionID>.jsonl and reports whether a
// file stands there, whether it holds a turn (an assistant record) and the
// totalCostUSD of its last cost-state record (0 when it has none or no
// turn). A file that is not a regular file of uid, or a path through a
// symlink, is found but refused (err, no turn), so the session starts
// afresh rather than the worker following it.
func readTranscript(configRoot, conv, sessionID string, uid int) (found, hasTurn bool, cost float64, err error) {
	if sessionID == "" || strings.ContainsAny(sessionID, "/\x00") {
		return false, false, 0, nil
	}
	root, err := agentfs.OpenRoot(configRoot)
	if err != nil {
		return false, false, 0, nil // no config dir yet: no transcript
	}
	defer root.Close()
	projects, err := root.OpenDir(conv + "/projects")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, false, 0, nil
	case err != nil:
		return true, false, 0, err
	}
	defer projects.Close()
	names, err := projects.Names(maxProjects)
	if err != nil && !errors.Is(err, agentfs.ErrTooMany) {
		return true, false, 0, err
	}
	var refused error
	for _, name := range names {
		f, size, err := projects.Open(name+"/"+sessionID+".jsonl", agentfs.Limits{UID: uid})
		switch {
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, agentfs.ErrNotDir):
			continue
		case err != nil:
			found, refused = true, err
			continue
		}
		found = true
		hasTurn, cost = scanTranscript(f, size)
		f.Close()
		if hasTurn {
			return true, true, cost, nil
		}
	}
	return found, false, 0, refused
}

var (
	assistantMark = []byte(`"type":"assistant"`)
	costStateMark = []byte(`"type":"cost-state"`)
)

// scanTranscript reports whether the first transcriptHead bytes of a
// transcript hold an assistant record (a longer transcript without one in
// its head is taken to hold a turn: the CLI, running as the agent, reads
// it on resume) and the totalCostUSD of the last cost-state record within
// its last transcriptTail bytes.
func scanTranscript(f io.ReaderAt, size int64) (hasTurn bool, cost float64) {
	hasTurn = containsMark(io.NewSectionReader(f, 0, min(size, transcriptHead)), assistantMark)
	if !hasTurn && size > transcriptHead {
		hasTurn = true
	}
	if !hasTurn {
		return false, 0
	}
	return true, lastCostState(f, size)
}

// containsMark reports whether r holds mark, reading 64 KiB at a time.
func containsMark(r io.Reader, mark []byte) bool {
	buf := make([]byte, 64<<10)
	keep := 0
	for {
		n, err := io.ReadFull(r, buf[keep:])
		data := buf[:keep+n]
		if bytes.Contains(data, mark) {
			return true
		}
		if err != nil {
			return false
		}
		keep = min(len(mark)-1, len(data))
		copy(buf, data[len(data)-keep:])
	}
}

// lastCostState returns totalCostUSD of the last cost-state record within
// the last transcriptTail bytes, 0 when there is none. Lines over 64 KiB
// are skipped (a cost-state record is a short line).
func lastCostState(f io.ReaderAt, size int64) float64 {
	off := max(0, size-transcriptTail)
	br := bufio.NewReaderSize(io.NewSectionReader(f, off, size-off), 64<<10)
	skip := off > 0 // the first line may be cut: skip it
	var last float64
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			skip = true // the rest of a long line follows
			continue
		}
		if !skip && bytes.Contains(line, costStateMark) {
			var rec struct {
				Type         string  `json:"type"`
				TotalCostUSD float64 `json:"totalCostUSD"`
			}
			if json.Unmarshal(line, &rec) == nil && rec.Type == "cost-state" {
				last = rec.TotalCostUSD
			}
		}
		skip = false
		if err != nil {
			return last
		}
	}
}
