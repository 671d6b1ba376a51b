package localrun

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/testlane"
	"github.com/talkide/talkide/internal/worker/claudecli"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// TestMovedStateDirKeepsConversations guards against case W3: after the
// platform was stopped and its state directory moved (a new mount path of
// the session volume, a restored backup), every message of an old
// conversation failed with start_failed "fork/exec …/claude: permission
// denied", because state.json held the old absolute working directory and
// the worker re-created it, root-owned, outside the volume. Now the turn
// completes with the conversation's history (the model's request holds the
// earlier messages), the old path stays gone, and the conversation's files
// are under the new state directory.
//
// It runs make run's platform (separate processes, the real CLI, agents
// jailed as users of their own when run as root) against a development
// upstream inside the test, so the model's requests can be read.
func TestMovedStateDirKeepsConversations(t *testing.T) {
	testlane.NeedsCLI(t)
	claude, err := claudecli.Find()
	if err != nil {
		t.Fatal(err)
	}
	bin := buildBinaries(t)
	const upstreamKey = "sk-ant-move-test-upstream-key"
	up := devupstream.New(devupstream.Config{APIKey: upstreamKey, Logger: slog.New(slog.DiscardHandler)})
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()

	parent := platformtest.AgentReachableTempDir(t)
	oldState, newState := filepath.Join(parent, "state-before"), filepath.Join(parent, "moved", "state-after")
	start := func(state string) *movedRun {
		return startMoveRun(t, Config{StateDir: state, BinDir: bin, APIKey: upstreamKey, UpstreamURL: upSrv.URL,
			ExtraEnv: []string{"TALKIDE_CLAUDE_BIN=" + claude}})
	}

	r := start(oldState)
	conv := r.createConversation()
	const word = "PINEAPPLE-4711"
	r.send(conv, "please remember the word "+word)
	last := r.followTurn(conv, 0, contract.EventTurnCompleted)
	r.stop()

	if err := os.MkdirAll(filepath.Dir(newState), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(oldState, newState); err != nil {
		t.Fatal(err)
	}
	nRequests := len(up.Requests())

	r = start(newState)
	defer r.stop()
	r.send(conv, "which word did I ask you to remember?")
	r.followTurn(conv, last, contract.EventTurnCompleted)

	// The model saw the earlier turn: a model request after the move holds
	// the first message and the answer to it.
	sawHistory := false
	for _, req := range up.Requests()[nRequests:] {
		var body struct {
			Messages []struct {
				Role    string          `json:"role"`
				Content json.RawMessage `json:"content"`
			} `json:"messages"`
		}
		if req.Path != "/v1/messages" || json.Unmarshal(req.Body, &body) != nil {
			continue
		}
		var first, assistant, second bool
		for _, m := range body.Messages {
			c := string(m.Content)
			first = first || m.Role == "user" && strings.Contains(c, "please remember the word "+word)
			assistant = assistant || m.Role == "assistant" && strings.Contains(c, word)
			second = second || m.Role == "user" && strings.Contains(c, "which word did I ask you to remember?")
		}
		sawHistory = sawHistory || first && assistant && second
	}
	if !sawHistory {
		t.Errorf("no model request after the move holds the earlier turn (%d requests)", len(up.Requests())-nRequests)
	}

	if _, err := os.Lstat(oldState); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the old state dir %s exists again after the move (err %v)", oldState, err)
	}
	sessions := filepath.Join(newState, "sessions", "demo-dev")
	workDir := filepath.Join(sessions, "workspaces", conv)
	if st, err := os.Stat(workDir); err != nil || !st.IsDir() {
		t.Errorf("the conversation's working directory %s: %v", workDir, err)
	}
	var got struct {
		Worker *contract.SessionStatus `json:"worker"`
	}
	if st, b := r.call("GET", "/api/conversations/"+conv, ""); st != 200 || json.Unmarshal(b, &got) != nil || got.Worker == nil {
		t.Fatalf("conversation status: %d %s", st, b)
	}
	if got.Worker.WorkDir != workDir {
		t.Errorf("status work_dir = %q, want %q", got.Worker.WorkDir, workDir)
	}
	store, err := sessionstore.Open(filepath.Join(sessions, "talkide"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := store.LoadMeta(conv)
	if err != nil {
		t.Fatal(err)
	}
	if state, _ := json.Marshal(m); bytes.Contains(state, []byte(oldState)) {
		t.Errorf("the stored state still names the old state dir %s:\n%s", oldState, state)
	}
}

// movedRun is one run of the platform for TestMovedStateDirKeepsConversations.
type movedRun struct {
	t    *testing.T
	base string
	tok  string
	stop func()
	logs string
}

// startMoveRun runs the platform with cfg (on a free address) and waits for
// its banner.
func startMoveRun(t *testing.T, cfg Config) *movedRun {
	t.Helper()
	r := launch(t, cfg)
	return &movedRun{t: t, base: "http://" + r.addr, tok: r.tok, stop: r.stop, logs: cfg.StateDir}
}

func (r *movedRun) call(method, path, body string) (int, []byte) {
	r.t.Helper()
	req, _ := http.NewRequest(method, r.base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+r.tok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (r *movedRun) createConversation() string {
	r.t.Helper()
	st, b := r.call("POST", "/api/conversations", `{"tenant":"demo","env":"dev"}`)
	var conv struct{ ID string }
	if st != 201 || json.Unmarshal(b, &conv) != nil || conv.ID == "" {
		r.t.Fatalf("create conversation: %d %s", st, b)
	}
	return conv.ID
}

func (r *movedRun) send(conv, text string) {
	r.t.Helper()
	body, _ := json.Marshal(map[string]string{"text": text})
	if st, b := r.call("POST", "/api/conversations/"+conv+"/messages", string(body)); st != 202 {
		r.t.Fatalf("send: %d %s", st, b)
	}
}

// followTurn reads the conversation's stream after event id after until a
// turn ends, fails the test unless it ended with want, and returns the id
// of that event.
func (r *movedRun) followTurn(conv string, after int64, want contract.EventType) int64 {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", r.base+"/api/conversations/"+conv+"/stream", nil)
	req.Header.Set("Authorization", "Bearer "+r.tok)
	req.Header.Set("Last-Event-ID", strconv.FormatInt(after, 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev contract.Event
		if json.Unmarshal([]byte(data), &ev) != nil {
			continue
		}
		if ev.Type != contract.EventTurnCompleted && ev.Type != contract.EventTurnFailed {
			continue
		}
		if ev.Type != want {
			r.t.Fatalf("turn ended with %s %s, want %s; logs:\n%s", ev.Type, ev.Data, want, logs(r.logs))
		}
		return ev.ID
	}
	r.t.Fatalf("the stream ended without the turn's end: %v; logs:\n%s", sc.Err(), logs(r.logs))
	return 0
}
