package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/sse"
	"github.com/talkide/talkide/internal/token"
)

// guard bounds a wait that must end at once when the control plane answers;
// it only turns a hang (the fault this file guards against) into a failure.
const guard = 30 * time.Second

// TestOpenFilesLimitRefusesInsteadOfHanging guards the exhaustion case of
// issue 10 item 9: at its open-files limit the control plane stopped
// accepting without refusing (requests, /healthz and model calls waited
// unanswered), its database could not open files, and browser streams whose
// worker connection failed were answered 200 with nothing behind them.
//
// The control plane runs with RLIMIT_NOFILE lowered to 256. Browser streams
// are opened until one is refused: each one admitted must relay its
// worker's events, and the refusal must be a 503 with Retry-After in the
// error shape. With every admitted stream still open, /healthz, a model
// call through the gateway and a database write must still succeed. Then
// idle connections are opened until the listener refuses one: with a 503
// and Retry-After, never a hang. Nothing may log "too many open files".
func TestOpenFilesLimitRefusesInsteadOfHanging(t *testing.T) {
	master, err := token.NewMasterKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	up := &heldUpstream{release: make(chan struct{})}
	close(up.release) // answers at once
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	worker := newFakeWorker()
	wSrv := httptest.NewServer(worker)
	t.Cleanup(wSrv.Close)
	p := startControlPlaneProcess(t, []string{
		"TALKIDE_MASTER_KEYS=" + master.String(), "TALKIDE_DB_PATH=" + filepath.Join(t.TempDir(), "cp.db"),
		"TALKIDE_UPSTREAM_URL=" + upSrv.URL, "ANTHROPIC_API_KEY=sk-test", "TALKIDE_WORKER_URL_TEMPLATE=" + wSrv.URL,
		"TALKIDE_DEV_USER_TOKEN=" + testUserToken, "TALKIDE_DEV_GRANTS=demo/dev", "TALKIDE_SHUTDOWN_GRACE=1s",
	}, "ulimit -n 256 &&")
	p.waitReady(t)
	st, body := browserDo(t, p.URL, "POST", "/api/conversations", `{"tenant":"demo","env":"dev"}`)
	if st != http.StatusCreated {
		t.Fatalf("create conversation: %d %s", st, body)
	}
	var conv struct{ ID string }
	json.Unmarshal(body, &conv)
	worker.add(conv.ID)
	rssBefore := rss(p)

	// Browser streams, each on its own connection, until one is refused.
	streams := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(streams.CloseIdleConnections)
	var open []io.Closer
	t.Cleanup(func() {
		for _, c := range open {
			c.Close()
		}
	})
	var refusal *http.Response
	for len(open) < 256 && refusal == nil {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", p.URL+"/api/conversations/"+conv.ID+"/stream", nil)
		req.Header.Set("Authorization", "Bearer "+testUserToken)
		resp, err := within(t, "open browser stream", func() (*http.Response, error) { return streams.Do(req) })
		if err != nil {
			t.Fatalf("browser stream %d: %v", len(open)+1, err)
		}
		if resp.StatusCode != http.StatusOK {
			refusal = resp
			break
		}
		open = append(open, resp.Body)
		ev, err := within(t, "first event of a browser stream", func() (contract.Event, error) { return readEvent(sse.NewReader(resp.Body)) })
		if err != nil || ev.ID != 1 {
			t.Fatalf("browser stream %d answered 200 but relays nothing: %+v, %v", len(open), ev, err)
		}
	}
	if refusal == nil {
		t.Fatalf("%d browser streams with RLIMIT_NOFILE 256 and none refused", len(open))
	}
	b, _ := io.ReadAll(refusal.Body)
	refusal.Body.Close()
	var eb contract.ErrorBody
	if err := json.Unmarshal(b, &eb); refusal.StatusCode != http.StatusServiceUnavailable || refusal.Header.Get("Retry-After") == "" || err != nil || eb.Error.Type != contract.ErrTypeUnavailable {
		t.Fatalf("stream %d: got %d (Retry-After %q) %s, want 503 unavailable with Retry-After", len(open)+1, refusal.StatusCode, refusal.Header.Get("Retry-After"), b)
	}
	t.Logf("%d browser streams admitted, the next refused: %s", len(open), eb.Error.Message)
	if before, after := rssBefore, rss(p); before > 0 && after > before {
		t.Logf("control plane RSS %d KiB before the streams, %d KiB with them: %d KiB per stream (race detector on)", before, after, (after-before)/int64(len(open)))
	}

	// What the reserve is for still works.
	if st, b := within2(t, "GET /healthz", func() (int, []byte) { return browserDo(t, p.URL, "GET", "/healthz", "") }); st != http.StatusOK {
		t.Errorf("/healthz with every stream open: %d %s", st, b)
	}
	if st, b := within2(t, "create a conversation", func() (int, []byte) {
		return browserDo(t, p.URL, "POST", "/api/conversations", `{"tenant":"demo","env":"dev"}`)
	}); st != http.StatusCreated {
		t.Errorf("database write with every stream open: %d %s", st, b)
	}
	types, err := within(t, "model call", func() ([]string, error) { return modelCall(t, p.URL, master, conv.ID) })
	if err != nil || len(types) == 0 || types[len(types)-1] != "message_stop" {
		t.Errorf("model call with every stream open: events %v, %v; want a complete answer", types, err)
	}

	// Idle connections until the listener refuses one.
	var refused bool
	for i := 0; i < 256 && !refused; i++ {
		c, err := net.Dial("tcp", strings.TrimPrefix(p.URL, "http://"))
		if err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
		open = append(open, c)
		c.SetDeadline(time.Now().Add(guard))
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: cp\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("connection %d: no answer (%v): the control plane hangs at its limit", i+1, err)
		}
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
			refused = true
		case resp.StatusCode != http.StatusOK:
			t.Fatalf("connection %d: got %d, want 200 or 503 with Retry-After", i+1, resp.StatusCode)
		}
	}
	if !refused {
		t.Errorf("256 more connections and none refused")
	}
	if strings.Contains(strings.ToLower(p.Log()), "too many open files") {
		t.Errorf("the control plane ran out of open files:\n%s", p.Log())
	}
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// within runs f, failing the test if it does not return within guard.
func within[T any](t *testing.T, what string, f func() (T, error)) (T, error) {
	t.Helper()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-time.After(guard):
		t.Fatalf("%s: no answer: the control plane hangs at its limit", what)
		panic("unreachable")
	}
}

func within2(t *testing.T, what string, f func() (int, []byte)) (int, []byte) {
	t.Helper()
	type r struct {
		st int
		b  []byte
	}
	v, _ := within(t, what, func() (r, error) { st, b := f(); return r{st, b}, nil })
	return v.st, v.b
}

// modelCall makes a streamed model call through the gateway as the worker
// would and returns the types of the events it got.
func modelCall(t *testing.T, base string, master token.MasterKey, conv string) ([]string, error) {
	wt, err := token.NewSigner(token.PurposeGateway, master.Derive(token.PurposeGateway, "", "")).
		Sign(token.Claims{Tenant: "demo", Env: "dev", Conversation: conv, User: "dev"}, token.WorkerTokenTTL)
	if err != nil {
		return nil, err
	}
	req, _ := http.NewRequestWithContext(t.Context(), "POST", base+contract.PathGatewayPrefix+"/v1/messages",
		strings.NewReader(`{"model":"`+testModel+`","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set(contract.HeaderWorkerToken, wt)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, errors.New(resp.Status + " " + string(b))
	}
	var types []string
	r := sse.NewReader(resp.Body)
	for {
		e, err := r.Next()
		if errors.Is(err, io.EOF) {
			return types, nil
		}
		if err != nil {
			return types, err
		}
		types = append(types, e.Type)
	}
}

// rss returns the process's resident memory in KiB, or 0.
func rss(p *cpProcess) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.Cmd.Process.Pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var n int64
			for _, c := range strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")) {
				n = n*10 + int64(c-'0')
			}
			return n
		}
	}
	return 0
}
