package localrun

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/testlane"
	"github.com/talkide/talkide/internal/worker/claudecli"
)

// TestUserAddWhileRunning: the README's one command for a second user,
// `talkide user add NAME`, run as its own process against the state dir of
// a platform that is running (as `make run` leaves it), prints a URL on
// the run's address whose token works on the browser API at once, with the
// grant asked for; a name that exists is refused and keeps its token; a
// state dir no run has used is refused saying what to do.
func TestUserAddWhileRunning(t *testing.T) {
	testlane.NeedsCLI(t)
	claude, err := claudecli.Find()
	if err != nil {
		t.Fatal(err)
	}
	r := startRun(t, claude)
	defer r.stop()
	talkide := func(state string, args ...string) (string, string, error) {
		cmd := exec.Command(filepath.Join(r.bin, "talkide"), args...)
		// No TALKIDE_HTTP_ADDR: the URL's address comes from the state dir.
		cmd.Env = childEnv([]string{"TALKIDE_STATE_DIR=" + state})
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	call := func(tok, method, path, body string) (int, string) {
		req, _ := http.NewRequestWithContext(context.Background(), method, "http://"+r.addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	urlRe := regexp.MustCompile(`Open in a browser:\s+(\S+)#token=(\S+)`)
	tokRe := regexp.MustCompile(`User token:\s+(\S+)`)
	added := func(out string) (url, tok string) {
		t.Helper()
		m, mt := urlRe.FindStringSubmatch(out), tokRe.FindStringSubmatch(out)
		if m == nil || mt == nil || m[2] != mt[1] {
			t.Fatalf("user add printed no URL with the token and the same token on its own line:\n%s", out)
		}
		return m[1], m[2]
	}

	out, errOut, err := talkide(r.state, "user", "add", "alice")
	if err != nil {
		t.Fatalf("talkide user add alice: %v\n%s%s", err, out, errOut)
	}
	url, alice := added(out)
	if want := "http://" + r.addr + "/"; url != want {
		t.Errorf("URL %s, want the run's %s", url, want)
	}
	if !strings.Contains(r.out.String(), "TALKIDE_STATE_DIR="+r.state+" "+filepath.Join(r.bin, "talkide")+" user add NAME") {
		t.Errorf("the banner does not say how to add a user to this run (its state dir is not the default):\n%s", r.out.String())
	}
	if alice == r.tok {
		t.Fatal("alice got the dev user's token")
	}
	const demo = `{"tenant":"demo","env":"dev"}`
	if st, b := call(alice, "POST", "/api/conversations", demo); st != http.StatusCreated {
		t.Errorf("alice creates a conversation in demo/dev: %d %s, want 201", st, b)
	}
	if st, b := call(alice, "GET", "/api/tenants/demo/envs/dev/issues", ""); st != http.StatusOK {
		t.Errorf("alice lists demo/dev's issues: %d %s, want 200", st, b)
	}
	if st, b := call(alice, "GET", "/api/me", ""); st != http.StatusOK || !strings.Contains(b, `"user":"alice"`) || !strings.Contains(b, `{"tenant":"demo","env":"dev"}`) {
		t.Errorf("alice's /api/me: %d %s, want 200 naming alice with the grant demo/dev", st, b)
	}

	// A name that exists: refused, with a non-zero exit, and alice's token
	// still works (nothing was replaced).
	out, errOut, err = talkide(r.state, "user", "add", "alice")
	if err == nil || !strings.Contains(errOut, "a user named alice exists already") || strings.Contains(out, "#token=") {
		t.Errorf("second user add alice: err %v, stdout %q, stderr %q; want a refusal naming alice", err, out, errOut)
	}
	if st, b := call(alice, "GET", "/api/tenants/demo/envs/dev/issues", ""); st != http.StatusOK {
		t.Errorf("alice's token after the refused duplicate: %d %s, want 200", st, b)
	}
	if out, errOut, err = talkide(r.state, "user", "add", "dev"); err == nil {
		t.Errorf("user add dev (the run's own user) was accepted: %s%s", out, errOut)
	}
	if st, _ := call(r.tok, "GET", "/api/tenants/demo/envs/dev/issues", ""); st != http.StatusOK {
		t.Errorf("the dev user's token after user add dev: %d, want 200", st)
	}

	// Flags after the name: bob gets acme/prod only.
	out, errOut, err = talkide(r.state, "user", "add", "bob", "-tenant", "acme", "-env", "prod")
	if err != nil {
		t.Fatalf("talkide user add bob -tenant acme -env prod: %v\n%s%s", err, out, errOut)
	}
	_, bob := added(out)
	if !strings.Contains(out, "acme / prod") {
		t.Errorf("user add does not say bob's grant:\n%s", out)
	}
	if st, b := call(bob, "POST", "/api/conversations", demo); st != http.StatusForbidden {
		t.Errorf("bob creates a conversation in demo/dev: %d %s, want 403", st, b)
	}
	if st, b := call(bob, "GET", "/api/tenants/acme/envs/prod/issues", ""); st != http.StatusOK {
		t.Errorf("bob lists acme/prod's issues: %d %s, want 200", st, b)
	}

	// A state dir no run has used.
	_, errOut, err = talkide(t.TempDir(), "user", "add", "carol")
	if err == nil || !strings.Contains(errOut, "make run") || !strings.Contains(errOut, "TALKIDE_STATE_DIR") {
		t.Errorf("user add without a run's state dir: err %v, stderr %q; want a refusal saying make run and TALKIDE_STATE_DIR", err, errOut)
	}
}

// TestSlowStartIsReported: a platform that takes long to become healthy is
// reported with what healthz says, at each of slowStartReports; a quick one
// is not reported at all.
func TestSlowStartIsReported(t *testing.T) {
	defer func(r []time.Duration) { slowStartReports = r }(slowStartReports)
	slowStartReports = []time.Duration{300 * time.Millisecond, 600 * time.Millisecond}
	healthyAt := time.Now().Add(time.Second)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if time.Now().Before(healthyAt) {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"type":"unavailable","message":"worker demo/dev is not ready"}}`)
			return
		}
		io.WriteString(w, `{"status":"ok"}`)
	}))
	defer srv.Close()
	var got []string
	progress := func(waited time.Duration, last error) { got = append(got, last.Error()) }
	if err := waitHealthy(t.Context(), srv.URL, 30*time.Second, nil, progress); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !strings.Contains(got[0], "worker demo/dev is not ready") {
		t.Errorf("reports %q, want two quoting healthz", got)
	}
	got = nil
	if err := waitHealthy(t.Context(), srv.URL, 30*time.Second, nil, progress); err != nil || len(got) != 0 {
		t.Errorf("a quick start: %v, reports %q; want none", err, got)
	}
}
