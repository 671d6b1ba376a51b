package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker"
	"github.com/talkide/talkide/internal/worker/localproxy"
)

// secretVolume is the Secret talkide-worker-token mounted the kubelet's
// way: <dir>/identity-token → ..data/identity-token, ..data → a version
// directory; put swaps in a new version as the kubelet does.
type secretVolume struct {
	t       *testing.T
	dir     string
	version int
}

func (v *secretVolume) path() string { return filepath.Join(v.dir, "identity-token") }

// put makes tok the token of the volume.
func (v *secretVolume) put(tok string) {
	v.t.Helper()
	v.version++
	ver := fmt.Sprintf("..2026_01_01_00_00_00.%d", v.version)
	if err := os.Mkdir(filepath.Join(v.dir, ver), 0o755); err != nil {
		v.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v.dir, ver, "identity-token"), []byte(tok), 0o644); err != nil {
		v.t.Fatal(err)
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ver, tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
	if v.version == 1 {
		if err := os.Symlink(filepath.Join("..data", "identity-token"), v.path()); err != nil {
			v.t.Fatal(err)
		}
		return
	}
	os.RemoveAll(filepath.Join(v.dir, fmt.Sprintf("..2026_01_01_00_00_00.%d", v.version-1)))
}

// readiness is the worker's /readyz answer.
type readiness struct {
	status int
	body   struct {
		Status           string    `json:"status"`
		Reason           string    `json:"reason"`
		Message          string    `json:"message"`
		TokenFingerprint string    `json:"token_fingerprint"`
		JTI              string    `json:"jti"`
		Since            time.Time `json:"since"`
		ExitAt           time.Time `json:"exit_at"`
	}
	raw string
}

func readyz(t *testing.T, workerURL string) readiness {
	t.Helper()
	resp, err := http.Get(workerURL + "/readyz")
	if err != nil {
		t.Fatalf("readyz: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := readiness{status: resp.StatusCode, raw: string(b)}
	if err := json.Unmarshal(b, &r.body); err != nil {
		t.Fatalf("readyz body %q: %v", b, err)
	}
	return r
}

// waitReadyz polls /readyz until it answers status; the bound only turns a
// hang into a failure.
func waitReadyz(t *testing.T, workerURL string, status int) readiness {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r := readyz(t, workerURL)
		if r.status == status {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz: still %d %s, want %d", r.status, r.raw, status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRevokedIdentityTokenWithSuccessor revokes the worker's identity
// token with no successor in its file: the next model call fails as a mint
// refusal always did (403 permission_error to the CLI, a failed turn), the
// worker logs the reason and turns unready with it. Another tenant-env's
// token written to the file changes nothing; a successor swapped in the
// kubelet's way makes the worker ready again, and the next turn mints with
// it. (The exit after the grace is tested on the real binary, in
// cmd/talkide-worker.)
func TestRevokedIdentityTokenWithSuccessor(t *testing.T) {
	vol := &secretVolume{t: t, dir: t.TempDir()}
	logs := &platformtest.LogBuffer{}
	var tokA string
	p := platformtest.Start(t, platformtest.Options{Worker: func(c *worker.Config) {
		tokA = c.IdentityToken
		vol.put(tokA)
		c.IdentityToken, c.IdentityTokenFile = "", vol.path()
		c.IdentityFailureGrace = time.Hour // the worker must not exit in this test
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	}})
	claimsA, err := localproxy.ParseIdentityToken(tokA, p.Tenant, p.Env, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	conv := p.NewConversation()
	s := p.OpenStream(conv, 0)
	p.Send(conv, "hello")
	if end := s.Until(3*time.Minute, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
		t.Fatalf("first turn: got %s %s, want turn_completed with the token from the file", end.Type, end.Data)
	}

	db, err := controlstore.OpenSQLite(context.Background(), p.DBPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.RevokeIdentityToken(context.Background(), claimsA.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	p.Send(conv, "hello again")
	end := s.Until(3*time.Minute, platformtest.TurnEnd)
	if f := platformtest.Payload[contract.TurnFailed](t, end); end.Type != contract.EventTurnFailed || f.Reason != contract.FailAPIError || f.APIErrorStatus != http.StatusForbidden {
		t.Errorf("turn with the token revoked: got %s %+v, want turn_failed api_error 403 (the local proxy's answer to a mint refusal)", end.Type, f)
	}
	r := waitReadyz(t, p.WorkerURL, http.StatusServiceUnavailable)
	if r.body.Status != "not ready" || r.body.Reason != "identity_token_revoked" || r.body.JTI != claimsA.ID ||
		r.body.TokenFingerprint != token.Fingerprint(tokA) || !strings.Contains(r.body.Message, "revoked") || !r.body.ExitAt.After(r.body.Since) {
		t.Errorf("readyz: got %s, want not ready, reason identity_token_revoked, A's jti %s and fingerprint %s, an exit time", r.raw, claimsA.ID, token.Fingerprint(tokA))
	}

	issuer := mint.New(db, p.Master, slog.New(slog.DiscardHandler))
	foreign, err := issuer.IssueIdentity(context.Background(), "globex", p.Env, 0)
	if err != nil {
		t.Fatal(err)
	}
	vol.put(foreign)
	waitLog(t, logs, "identity token in the file refused")
	if r := readyz(t, p.WorkerURL); r.status != http.StatusServiceUnavailable || r.body.JTI != claimsA.ID {
		t.Errorf("readyz with another tenant-env's token in the file: got %d %s, want still 503 for A", r.status, r.raw)
	}

	tokB, err := issuer.IssueIdentity(context.Background(), p.Tenant, p.Env, 0)
	if err != nil {
		t.Fatal(err)
	}
	vol.put(tokB)
	waitReadyz(t, p.WorkerURL, http.StatusOK)
	p.Send(conv, "and once more")
	if end := s.Until(3*time.Minute, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
		t.Errorf("turn with the successor: got %s %s, want turn_completed", end.Type, end.Data)
	}

	l := logs.String()
	for _, want := range []string{"identity token can no longer mint", `"reason":"revoked"`, claimsA.ID, token.Fingerprint(foreign), "bound to globex/dev", "identity token failure cleared"} {
		if !strings.Contains(l, want) {
			t.Errorf("worker log lacks %q", want)
		}
	}
	for name, tok := range map[string]string{"A": tokA, "B": tokB, "the foreign token": foreign} {
		if strings.Contains(l, tok) {
			t.Errorf("worker log contains identity token %s", name)
		}
	}
}

// waitLog waits until logs hold want.
func waitLog(t *testing.T, logs *platformtest.LogBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(logs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("log never said %q", want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestConfigIdentitySettings(t *testing.T) {
	master, _ := token.NewMasterKey("k1")
	sign := func(tenant string) string {
		tok, err := token.NewSigner(token.PurposeIdentity, master.Derive(token.PurposeIdentity, "", "")).Sign(token.Claims{Tenant: tenant, Env: "dev"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	dir := t.TempDir()
	own, other := filepath.Join(dir, "own"), filepath.Join(dir, "other")
	os.WriteFile(own, []byte(sign("acme")+"\n"), 0o600)
	os.WriteFile(other, []byte(sign("globex")), 0o600)
	gw, _ := url.Parse("http://cp")
	cases := []struct {
		name        string
		token, file string
		want        string // "": valid
	}{
		{"token", sign("acme"), "", ""},
		{"file", "", own, ""},
		{"both", sign("acme"), own, "not both"},
		{"neither", "", "", "TALKIDE_WORKER_IDENTITY_TOKEN_FILE"},
		{"missing file", "", filepath.Join(dir, "absent"), "TALKIDE_WORKER_IDENTITY_TOKEN_FILE"},
		{"other tenant-env in the file", "", other, "bound to globex/dev"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := worker.Config{Tenant: "acme", Env: "dev", RequestKeys: []token.Key{{ID: "k"}}, GatewayBaseURL: gw,
				IdentityToken: tc.token, IdentityTokenFile: tc.file, ClaudeBin: "/bin/true", SessionDir: dir, Logger: slog.New(slog.DiscardHandler)}
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				if c.IdentityFailureGrace != time.Minute {
					t.Errorf("IdentityFailureGrace default: got %s, want 1m", c.IdentityFailureGrace)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate: got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
