package localrun

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/testlane"
	"github.com/talkide/talkide/internal/worker/claudecli"
)

// TestLoopbackIsNoBackDoor guards against case C7: in the one-machine run
// the development upstream answered any caller on loopback (an agent could
// spend past the gateway and the budget), and the control plane's /metrics
// (tenants and their spend) was open to loopback clients when no admin
// token was set, the `make run` default. Now the development upstream needs
// a key only the control plane holds, and /metrics of the control plane and
// the worker a token `make run` keeps in the state dir. It checks both from
// the test and from inside a conversation (the agent runs curl), and that
// turns still work through the gateway. By default (TALKIDE_AGENT_NETWORK
// private) the agent reaches none of them at all; with "host" it reaches
// them and is refused.
func TestLoopbackIsNoBackDoor(t *testing.T) {
	testlane.NeedsCLI(t)
	claude, err := claudecli.Find()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []struct{ network, want string }{{"", "000"}, {"host", "401"}} {
		t.Run("network="+mode.network, func(t *testing.T) { loopbackProbe(t, claude, mode.network, mode.want) })
	}
}

// loopbackProbe runs the checks of TestLoopbackIsNoBackDoor with
// TALKIDE_AGENT_NETWORK=network ("" for the default); want is the status
// the agent's curl sees (000: no connection).
func loopbackProbe(t *testing.T, claude, network, want string) {
	var env []string
	if network != "" {
		env = append(env, "TALKIDE_AGENT_NETWORK="+network)
	}
	r := startRun(t, claude, env...)
	addr, state, out, tok := r.addr, r.state, r.out, r.tok
	defer r.stop()
	tokenPath := filepath.Join(state, "metrics-token")
	if !strings.Contains(out.String(), "Metrics token:      "+tokenPath) {
		t.Errorf("the banner does not say where the metrics token is: %q", out.String())
	}
	b, err := os.ReadFile(tokenPath)
	if err != nil {
		t.Fatalf("metrics token: %v", err)
	}
	if st, err := os.Stat(tokenPath); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("metrics token file mode: %v %v, want 0600", st.Mode(), err)
	}
	metricsToken := strings.TrimSpace(string(b))
	devUp := logged(t, state, "devupstream", regexp.MustCompile(`listening on (http://\S+)`))
	workerURL := "http://" + logged(t, state, "worker", regexp.MustCompile(`"msg":"worker listening".*?"addr":"([^"]+)"`))
	cp := "http://" + addr

	get := func(method, url, bearer, body string) int {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	call := `{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	for _, key := range []string{"", "sk-ant-guess"} {
		if st := get("POST", devUp+"/v1/messages", key, call); st != http.StatusUnauthorized {
			t.Errorf("a model call straight to the development upstream with key %q: got %d, want 401", key, st)
		}
	}
	for name, url := range map[string]string{"control plane": cp + "/metrics", "worker": workerURL + "/metrics"} {
		if st := get("GET", url, "", ""); st == http.StatusOK {
			t.Errorf("%s /metrics without a token: got 200", name)
		}
		if st := get("GET", url, metricsToken, ""); st != http.StatusOK {
			t.Errorf("%s /metrics with the token of %s: got %d, want 200", name, tokenPath, st)
		}
	}

	// From inside a conversation: the agent tries both, and its own turns
	// still reach the model through the gateway.
	var conv struct{ ID string }
	req, _ := http.NewRequest("POST", cp+"/api/conversations", strings.NewReader(`{"tenant":"demo","env":"dev"}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&conv)
	resp.Body.Close()
	if conv.ID == "" {
		t.Fatalf("create conversation: %d", resp.StatusCode)
	}
	defer get("DELETE", cp+"/api/conversations/"+conv.ID, tok, "")
	probe := "curl -s -o /dev/null -w 'upstream=%{http_code} ' -H 'content-type: application/json' -d '" + call + "' " + devUp + "/v1/messages; " +
		"curl -s -o /dev/null -w 'cpmetrics=%{http_code} ' " + cp + "/metrics; " +
		"curl -s -o /dev/null -w 'workermetrics=%{http_code} ' " + workerURL + "/metrics; echo c7-probe"
	body, _ := json.Marshal(map[string]string{"text": "please run `" + probe + "`"})
	if st := get("POST", cp+"/api/conversations/"+conv.ID+"/messages", tok, string(body)); st != http.StatusAccepted {
		t.Fatalf("send: %d", st)
	}
	result := waitToolResult(t, cp, tok, conv.ID, "c7-probe")
	for _, w := range []string{"upstream=" + want, "cpmetrics=" + want, "workermetrics=" + want} {
		if !strings.Contains(result, w) {
			t.Errorf("the agent's probe: %q, want %s", result, w)
		}
	}
}

// logged returns the first submatch of re in the log of process name,
// waiting for it to appear.
func logged(t *testing.T, state, name string, re *regexp.Regexp) string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(state, "logs", name+".log"))
		if m := re.FindSubmatch(b); m != nil {
			return string(m[1])
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s.log has no %s:\n%s", name, re, b)
		}
	}
}
