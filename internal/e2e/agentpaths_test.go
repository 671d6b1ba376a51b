package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/platformtest"
)

// These tests are issue 9's cases C2 and C3: the worker, as root, must never
// follow what an agent puts in its own directories. The test plays the
// agent's background process (which, case C1, can outlive its CLI) by
// changing the agent's files between two CLI processes, as the agent's uid.

// agentOwns gives path (not a link's target) to the owner of dir, the
// agent, as if the agent had made it.
func agentOwns(t *testing.T, dir string, paths ...string) {
	t.Helper()
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	for _, p := range paths {
		if err := os.Lchown(p, int(st.Uid), int(st.Gid)); err != nil {
			t.Fatal(err)
		}
	}
}

// fifoWatch fails the test as soon as anyone opens fifo for reading (the
// worker following the agent's link), and unblocks that reader (a writer
// that opens and closes gives it EOF) so the run ends instead of hanging.
func fifoWatch(t *testing.T, fifo string) (opened *atomic.Bool, stop func()) {
	opened = &atomic.Bool{}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			// O_NONBLOCK write-open succeeds only while a reader has it open
			// (or waits in open).
			if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				opened.Store(true)
				f.Close()
			}
		}
	}()
	return opened, func() { close(done); <-finished }
}

// sendAsync sends a message without waiting for the answer: on the code this
// guards against, the send itself hangs while the worker blocks.
func sendAsync(p *platformtest.Platform, conv, text string) {
	b, _ := json.Marshal(map[string]string{"text": text})
	req, _ := http.NewRequest("POST", p.URL+"/api/conversations/"+conv+"/messages", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+p.UserToken)
	req.Header.Set("Content-Type", "application/json")
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
}

func isType(t contract.EventType) func(contract.Event) bool {
	return func(ev contract.Event) bool { return ev.Type == t }
}

// lastSessionID is the session id of the stream's last session_started.
func lastSessionID(t *testing.T, s *platformtest.Stream) string {
	t.Helper()
	id := ""
	for _, ev := range s.Events {
		if ev.Type == contract.EventSessionStarted {
			id = platformtest.Payload[contract.SessionStarted](t, ev).SessionID
		}
	}
	if id == "" {
		t.Fatal("no session_started event")
	}
	return id
}

// TestTranscriptSwappedForAFIFOBlocksNothing is case C2: after its CLI
// exited, the agent replaces its session transcript by a symlink to a FIFO
// (and, the second time, the project directory holding it by a symlink to
// a directory with a FIFO of that name). The next message must start a CLI
// at once: the worker must not open the FIFO (which blocked it forever,
// holding the session's lock and a process slot) nor read anything through
// the link, and the conversation goes on in a fresh session.
func TestTranscriptSwappedForAFIFOBlocksNothing(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{IdleTimeout: 2 * time.Second})
	conv := p.NewConversation()
	s := p.OpenStream(conv, 0)
	p.Send(conv, "please run `echo first-turn`")
	if end := s.Until(90*time.Second, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
		t.Fatalf("first turn: %s %s", end.Type, end.Data)
	}
	configDir := filepath.Join(p.SessionDir, "claude-config", conv)
	outside := platformtest.AgentReachableTempDir(t) // where the agent's links point

	for i, swap := range []struct {
		name string
		do   func(t *testing.T, transcript string) (fifo string)
	}{
		{"transcript is a symlink to a FIFO", func(t *testing.T, transcript string) string {
			fifo := filepath.Join(outside, "pipe-1")
			if err := syscall.Mkfifo(fifo, 0o666); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(transcript); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(fifo, transcript); err != nil {
				t.Fatal(err)
			}
			agentOwns(t, configDir, fifo, transcript)
			return fifo
		}},
		{"project directory is a symlink to a directory with a FIFO", func(t *testing.T, transcript string) string {
			dir := filepath.Join(outside, "proj")
			if err := os.Mkdir(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			fifo := filepath.Join(dir, filepath.Base(transcript))
			if err := syscall.Mkfifo(fifo, 0o666); err != nil {
				t.Fatal(err)
			}
			proj := filepath.Dir(transcript)
			if err := os.RemoveAll(proj); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(dir, proj); err != nil {
				t.Fatal(err)
			}
			agentOwns(t, configDir, dir, fifo, proj)
			return fifo
		}},
	} {
		// The CLI goes idle and stops; only then does the agent swap.
		s.Until(30*time.Second, isType(contract.EventSessionStopped))
		sid := lastSessionID(t, s)
		matches, _ := filepath.Glob(filepath.Join(configDir, "projects", "*", sid+".jsonl"))
		if len(matches) != 1 {
			t.Fatalf("%s: transcript of session %s: found %v", swap.name, sid, matches)
		}
		fifo := swap.do(t, matches[0])
		opened, stop := fifoWatch(t, fifo)
		from := len(s.Events)
		start := time.Now()
		sendAsync(p, conv, "please run `echo after-swap-"+string(rune('a'+i))+"`")
		end := s.Until(90*time.Second, platformtest.TurnEnd)
		stop()
		if opened.Load() {
			t.Errorf("%s: the worker opened the FIFO through the agent's link", swap.name)
		}
		if end.Type != contract.EventTurnCompleted {
			t.Errorf("%s: turn ended with %s %s", swap.name, end.Type, end.Data)
		}
		if took := time.Since(start); took > 60*time.Second {
			t.Errorf("%s: the turn took %s", swap.name, took)
		}
		var refused bool
		for _, ev := range s.Events[from:] {
			if ev.Type == contract.EventError && platformtest.Payload[contract.ErrorEvent](t, ev).Code == "transcript_refused" {
				refused = true
			}
		}
		if !refused {
			t.Errorf("%s: no transcript_refused event; events: %s", swap.name, platformtest.Summary(s.Events[from:]))
		}
		if sid2 := lastSessionID(t, s); sid2 == sid {
			t.Errorf("%s: the session went on with the refused transcript %s", swap.name, sid)
		}
	}
}

// TestMCPConfigLinkLeaksNothing is case C3: the agent makes its project's
// .mcp.json a symlink to a root-only file (then a hard link to it), and
// the CLI restarts. The mcp_server_refused event must not reveal anything
// of that file: not its first bytes through the JSON parser's error, not
// even whether it parses.
func TestMCPConfigLinkLeaksNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the worker must run as root for the agent to have a uid of its own")
	}
	p := platformtest.Start(t, platformtest.Options{IdleTimeout: 2 * time.Second})
	conv := p.NewConversation()
	s := p.OpenStream(conv, 0)
	p.Send(conv, "please run `echo first-turn`")
	if end := s.Until(90*time.Second, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
		t.Fatalf("first turn: %s %s", end.Type, end.Data)
	}
	// A root-only file beginning like the master key file does, on the
	// session volume (a hard link needs the same file system).
	secret := filepath.Join(p.SessionDir, "talkide", "test-master-key")
	const content = "lk1:SECRET-MASTER-KEY-MATERIAL"
	if err := os.WriteFile(secret, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	workDir := filepath.Join(p.SessionDir, "workspaces", conv)
	mcp := filepath.Join(workDir, ".mcp.json")
	for _, plant := range []struct {
		name string
		do   func() error
	}{
		{"symlink", func() error { return os.Symlink(secret, mcp) }},
		{"hard link", func() error { return os.Link(secret, mcp) }},
		{"symlinked directory", func() error {
			// .mcp.json in a directory the agent links to the secret's.
			if err := os.Symlink(filepath.Dir(secret), filepath.Join(workDir, "linked")); err != nil {
				return err
			}
			return os.Symlink("linked/test-master-key", mcp)
		}},
	} {
		s.Until(30*time.Second, isType(contract.EventSessionStopped))
		_ = os.Remove(mcp)
		if err := plant.do(); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Lstat(mcp); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			agentOwns(t, workDir, mcp)
		}
		from := len(s.Events)
		sendAsync(p, conv, "please run `echo after-"+strings.ReplaceAll(plant.name, " ", "-")+"`")
		end := s.Until(90*time.Second, platformtest.TurnEnd)
		if end.Type != contract.EventTurnCompleted {
			t.Errorf("%s: turn ended with %s %s", plant.name, end.Type, end.Data)
		}
		var refusals []string
		for _, ev := range s.Events[from:] {
			if ev.Type == contract.EventMCPServerRefused {
				refusals = append(refusals, platformtest.Payload[contract.MCPServerRefused](t, ev).Reason)
			}
			for _, leak := range []string{"invalid character", "'l'", "SECRET", "lk1"} {
				if strings.Contains(string(ev.Data), leak) {
					t.Errorf("%s: event %s quotes the root-only file (%q): %s", plant.name, ev.Type, leak, ev.Data)
				}
			}
		}
		if len(refusals) != 1 {
			t.Errorf("%s: got refusals %q, want one saying the file was not read", plant.name, refusals)
		}
		if b, _ := os.ReadFile(secret); string(b) != content {
			t.Fatalf("%s: the root-only file changed", plant.name)
		}
		if fi, _ := os.Stat(secret); fi.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Errorf("%s: the root-only file was given away", plant.name)
		}
		_ = os.Remove(filepath.Join(workDir, "linked"))
	}
}
