package e2e

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/worker"
)

// syncBuffer is a bytes.Buffer safe for concurrent log writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(with string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range strings.Split(s.b.String(), "\n") {
		if strings.Contains(l, with) {
			out = append(out, l)
		}
	}
	return out
}

// TestBrowserErrorFindsItsLogLines: a browser request the worker refuses
// answers an error whose request id finds the request's lines in the
// control plane's log and in the worker's, which got the id with the
// control plane's call.
func TestBrowserErrorFindsItsLogLines(t *testing.T) {
	var cpLog, wLog syncBuffer
	p := platformtest.Start(t, platformtest.Options{
		ControlPlane: func(c *controlplane.Config) { c.Logger = slog.New(slog.NewJSONHandler(&cpLog, nil)) },
		Worker:       func(c *worker.Config) { c.Logger = slog.New(slog.NewJSONHandler(&wLog, nil)) },
	})
	conv := p.NewConversation()
	// An answer to a permission request that does not exist: the control
	// plane passes it on, the worker answers 404.
	code, body := p.DoAs(p.UserToken, "POST", "/api/conversations/"+conv+"/permissions/req-none", "application/json", `{"behavior":"allow"}`)
	id := body.Error.RequestID
	if code != 404 || !strings.HasPrefix(id, "req_") {
		t.Fatalf("answer %d %+v, want 404 with a request id", code, body)
	}
	cp, w := cpLog.lines(`"request_id":"`+id+`"`), wLog.lines(`"request_id":"`+id+`"`)
	if len(cp) == 0 || len(w) == 0 {
		t.Fatalf("request %s: control plane lines %q, worker lines %q", id, cp, w)
	}
	if !strings.Contains(strings.Join(w, "\n"), "permission request not found") {
		t.Errorf("the worker's lines do not say what failed: %q", w)
	}
}

// TestFailedTurnNamesTheModelCall: a turn that fails because its model
// call failed, refused by the gateway (the budget) or by the upstream (an
// error Anthropic gives), shows the browser the call's request id in the
// turn_failed message, and that id finds the call's lines in the worker's
// log (its local proxy) and in the control plane's (the mint and the
// gateway).
func TestFailedTurnNamesTheModelCall(t *testing.T) {
	for _, tc := range []struct {
		name string
		// fail makes the turn's model call fail.
		fail func(p *platformtest.Platform)
		// cpLine is what the control plane's line about the failure holds.
		cpLine []string
		status string
	}{
		{"budget", func(p *platformtest.Platform) { setLimit(t, p, "dev", 1_000) }, // below any call's worst case
			[]string{`"msg":"gateway refused call"`, `"reason":"budget"`, "budget exceeded"}, `"status":429`},
		{"upstream error", func(p *platformtest.Platform) {
			p.Upstream.Script(errResponse(403, "permission_error", "model not enabled for this organisation"))
		}, []string{`"msg":"request"`, `"status":403`}, `"status":403`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cpLog, wLog syncBuffer
			p := platformtest.Start(t, platformtest.Options{
				ControlPlane: func(c *controlplane.Config) { c.Logger = slog.New(slog.NewJSONHandler(&cpLog, nil)) },
				Worker:       func(c *worker.Config) { c.Logger = slog.New(slog.NewJSONHandler(&wLog, nil)) },
			})
			tc.fail(p)
			conv := p.NewConversation()
			s := p.OpenStream(conv, 0)
			p.Send(conv, "hello")
			end := s.Until(5*time.Minute, platformtest.TurnEnd)
			if end.Type != contract.EventTurnFailed {
				t.Fatalf("got %s %s, want turn_failed", end.Type, end.Data)
			}
			f := platformtest.Payload[contract.TurnFailed](t, end)
			id := regexp.MustCompile(`req_[a-z2-7]{20}`).FindString(f.Message)
			if id == "" {
				t.Fatalf("turn_failed message names no request id: %q", f.Message)
			}
			cp, w := cpLog.lines(`"request_id":"`+id+`"`), wLog.lines(`"request_id":"`+id+`"`)
			found := false
			for _, l := range cp {
				all := true
				for _, want := range tc.cpLine {
					all = all && strings.Contains(l, want)
				}
				found = found || all
			}
			if !found || !strings.Contains(strings.Join(w, "\n"), tc.status) {
				t.Fatalf("request %s: control plane lines %q, worker lines %q", id, cp, w)
			}
		})
	}
}

// TestCallersChooseNoRequestIDBeforeAuthentication: the id a caller sends
// in X-Request-Id names its request only once its credential checks out
// (a worker's at the mint and the gateway, the control plane's at a
// worker). A browser, an agent on the worker's loopback or anyone else
// cannot stamp log lines with the id of someone else's turn.
func TestCallersChooseNoRequestIDBeforeAuthentication(t *testing.T) {
	var cpLog, wLog syncBuffer
	p := platformtest.Start(t, platformtest.Options{
		ControlPlane: func(c *controlplane.Config) { c.Logger = slog.New(slog.NewJSONHandler(&cpLog, nil)) },
		Worker:       func(c *worker.Config) { c.Logger = slog.New(slog.NewJSONHandler(&wLog, nil)) },
	})
	conv := p.NewConversation()
	const spoofed = "req_spoofedbyanyone01"
	for _, tc := range []struct {
		name, url, bearer string
		header            map[string]string
	}{
		{"gateway without a WorkerToken", p.URL + contract.PathGatewayPrefix + "/v1/messages", "", nil},
		{"gateway with a forged WorkerToken", p.URL + contract.PathGatewayPrefix + "/v1/messages", "", map[string]string{contract.HeaderWorkerToken: "forged"}},
		{"mint with a forged identity token", p.URL + contract.PathMint, "forged", nil},
		{"worker report without a token", p.URL + contract.PathReportPrefix + "/usage", "", nil},
		{"browser route with the user's token", p.URL + "/api/conversations/" + conv + "/permissions/req-none", p.UserToken, nil},
		{"worker API with a forged request token", p.WorkerURL + "/v1/conversations/" + conv + "/messages", "", map[string]string{contract.HeaderWorkerToken: "forged"}},
	} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, tc.url, strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Request-Id", spoofed)
		if tc.bearer != "" {
			req.Header.Set("Authorization", "Bearer "+tc.bearer)
		}
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 || resp.Header.Get("X-Request-Id") == "" || resp.Header.Get("X-Request-Id") == spoofed || strings.Contains(string(body), spoofed) {
			t.Errorf("%s: answered %d, X-Request-Id %q, body %s: want a refusal under an id of the platform's", tc.name, resp.StatusCode, resp.Header.Get("X-Request-Id"), body)
		}
	}
	if l := append(cpLog.lines(spoofed), wLog.lines(spoofed)...); len(l) != 0 {
		t.Errorf("log lines under the caller's id: %q", l)
	}
}
