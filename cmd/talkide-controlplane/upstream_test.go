package main

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/token"
)

// TestUnreachableUpstreamShowsAtStartAndInReadiness guards a first-run
// fault found from outside: with a model upstream that does not resolve,
// nothing was checked at start and the control plane looked ready. The
// control plane logs the cause at start and its /healthz answers 503 naming
// the upstream and the cause.
func TestUnreachableUpstreamShowsAtStartAndInReadiness(t *testing.T) {
	master, err := token.NewMasterKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	p := startControlPlaneProcess(t, []string{
		"TALKIDE_MASTER_KEYS=" + master.String(), "TALKIDE_DB_PATH=" + filepath.Join(t.TempDir(), "cp.db"),
		"TALKIDE_UPSTREAM_URL=https://upstream.invalid", "ANTHROPIC_API_KEY=sk-test",
	}, "")
	const cause = "DNS lookup of upstream.invalid failed"
	if log := p.Log(); !strings.Contains(log, "model upstream cannot be reached") || !strings.Contains(log, cause) {
		t.Errorf("start-up log does not name the unreachable upstream and %q:\n%s", cause, log)
	}
	resp, err := http.Get(p.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var eb contract.ErrorBody
	json.Unmarshal(b, &eb)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(eb.Error.Message, "model upstream https://upstream.invalid") || !strings.Contains(eb.Error.Message, cause) {
		t.Errorf("/healthz: got %d %s, want 503 naming the upstream and %q", resp.StatusCode, b, cause)
	}
	// The chart's probes: an upstream every replica shares takes none out
	// of its Service (/readyz) and restarts none (/livez).
	for path, want := range map[string]int{"/readyz": http.StatusOK, "/livez": http.StatusOK} {
		resp, err := http.Get(p.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: got %d, want %d", path, resp.StatusCode, want)
		}
	}
}
