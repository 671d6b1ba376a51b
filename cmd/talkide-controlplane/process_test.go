package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/sse"
)

// The tests of this file run the control plane as a real process: the test
// binary itself, re-executed with envExecMain set, runs main().
const envExecMain = "TALKIDE_TEST_EXEC_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envExecMain) == "1" {
		main()
		os.Exit(0)
	}
	kubetest.Main(m) // the provisioning commands' tests use the test cluster
}

// cpProcess is a control plane running as a child process.
type cpProcess struct{ *platformtest.Process }

// startControlPlaneProcess starts the control plane with env (on top of this
// process's environment without any TALKIDE_ or ANTHROPIC_ variable) and
// waits until it listens. wrap, when set, is a shell prefix such as
// `ulimit -n 200;` run before exec. The process is killed at the end of the
// test if it still runs.
func startControlPlaneProcess(t *testing.T, env []string, wrap string) *cpProcess {
	t.Helper()
	cmd := controlPlaneCommand(t, env...)
	if wrap != "" {
		cmd.Args = []string{"/bin/sh", "-c", wrap + ` exec "$0"`, cmd.Path}
		cmd.Path = "/bin/sh"
	}
	return &cpProcess{platformtest.StartProcess(t, cmd, "control plane listening", os.Kill, time.Minute)}
}

// controlPlaneCommand is this test binary run as the control plane, with
// env on top of this process's environment without any TALKIDE_ or
// ANTHROPIC_ variable (and TALKIDE_HTTP_ADDR a free loopback port unless
// env sets it).
func controlPlaneCommand(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TALKIDE_") && !strings.HasPrefix(kv, "ANTHROPIC_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, envExecMain+"=1", "TALKIDE_HTTP_ADDR=127.0.0.1:0")
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// waitReady polls /healthz until it answers 200.
func (p *cpProcess) waitReady(t *testing.T) {
	t.Helper()
	for {
		resp, err := http.Get(p.URL + "/healthz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-p.Exited:
			t.Fatalf("control plane exited: %v\n%s", p.Err, p.Log())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// fakeWorker is a tenant-env's worker as the control plane sees it: it
// creates sessions and serves a conversation's durable event log as SSE,
// resuming after Last-Event-ID and following new events, like the real
// worker's GET /v1/conversations/{id}/events.
type fakeWorker struct {
	mu sync.Mutex
	// events is the log of every conversation, ids 1, 2, ...; changed is
	// closed (and replaced) when one is appended. Guarded by mu.
	events  []contract.Event
	changed chan struct{}
}

func newFakeWorker() *fakeWorker { return &fakeWorker{changed: make(chan struct{})} }

// add appends an event and returns its id.
func (f *fakeWorker) add(conv string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := int64(len(f.events) + 1)
	f.events = append(f.events, contract.Event{ID: id, Type: "assistant_text", ConversationID: conv,
		Time: time.Now().UTC(), Data: json.RawMessage(`{"text":"event ` + strconv.FormatInt(id, 10) + `"}`)})
	close(f.changed)
	f.changed = make(chan struct{})
	return id
}

func (f *fakeWorker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/session") {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
		return
	}
	if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/events") {
		http.Error(w, `{"error":{"type":"not_found","message":"no"}}`, http.StatusNotFound)
		return
	}
	after, _ := strconv.ParseInt(r.Header.Get(contract.HeaderLastEventID), 10, 64)
	sw := sse.NewWriter(w)
	w.WriteHeader(http.StatusOK)
	sw.WriteComment("fake worker")
	for {
		f.mu.Lock()
		pending := append([]contract.Event(nil), f.events[min(int(after), len(f.events)):]...)
		changed := f.changed
		f.mu.Unlock()
		for _, ev := range pending {
			if err := sw.WriteJSON(strconv.FormatInt(ev.ID, 10), string(ev.Type), ev); err != nil {
				return
			}
			after = ev.ID
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

// readEvent reads the next event of a browser stream, skipping comments.
func readEvent(r *sse.Reader) (contract.Event, error) {
	for {
		e, err := r.Next()
		if err != nil {
			return contract.Event{}, err
		}
		if len(e.Data) == 0 {
			continue
		}
		var ev contract.Event
		return ev, json.Unmarshal(e.Data, &ev)
	}
}
