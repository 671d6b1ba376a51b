package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker"
	"github.com/talkide/talkide/internal/worker/localproxy"
)

// TestRevokedIdentityTokenExits runs the worker binary with its identity
// token in a file, behind a real control plane, and revokes the token with
// no successor. The next model call is refused by the mint; the worker must
// turn unready saying why, then, once TALKIDE_IDENTITY_FAILURE_GRACE has
// passed with nothing new in the file, exit with worker.ExitIdentity
// instead of retrying into 401s forever.
func TestRevokedIdentityTokenExits(t *testing.T) {
	r := newRig(t)
	tenant, env, dir, identity := r.tenant, r.env, r.dir, r.identity
	db := r.openDB()
	t.Cleanup(func() { db.Close() })
	claims, err := localproxy.ParseIdentityToken(identity, tenant, env, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "identity-token")
	if err := os.WriteFile(tokenFile, []byte(identity+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w := startWorkerProcess(t, r.workerEnv("TALKIDE_WORKER_IDENTITY_TOKEN_FILE="+tokenFile, "TALKIDE_IDENTITY_FAILURE_GRACE=5s"))
	p := r.startControlPlane(w.URL, nil)

	if err := db.RevokeIdentityToken(context.Background(), claims.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	conv := p.NewConversation()
	s := p.OpenStream(conv, 0)
	p.Send(conv, "hello")
	if end := s.Until(guard, platformtest.TurnEnd); end.Type != contract.EventTurnFailed {
		t.Errorf("turn with the token revoked: got %s %s, want turn_failed", end.Type, end.Data)
	}

	// Unready, saying why, until it exits.
	sawReason := false
poll:
	for {
		select {
		case <-w.Exited:
			break poll
		default:
		}
		if resp, err := http.Get(w.URL + "/readyz"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var body struct{ Status, Reason, JTI string }
			json.Unmarshal(b, &body)
			if resp.StatusCode == http.StatusServiceUnavailable && body.Reason == "identity_token_revoked" && body.JTI == claims.ID {
				sawReason = true
				break poll
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !sawReason {
		t.Error("readyz never answered 503 with reason identity_token_revoked and the token's jti before the worker exited")
	}

	select {
	case <-w.Exited:
	case <-time.After(guard):
		t.Fatal("the worker is still running after its identity token was revoked")
	}
	var ee *exec.ExitError
	if !errors.As(w.Err, &ee) || ee.ExitCode() != worker.ExitIdentity {
		t.Errorf("exit: got %v, want exit status %d (worker.ExitIdentity)", w.Err, worker.ExitIdentity)
	}
	l := w.Log()
	for _, want := range []string{"identity token can no longer mint", `"reason":"revoked"`, claims.ID, token.Fingerprint(identity), "no new identity token within 5s"} {
		if !strings.Contains(l, want) {
			t.Errorf("worker log lacks %q", want)
		}
	}
	if strings.Contains(l, identity) {
		t.Error("worker log contains the identity token")
	}
}

func TestIdentitySettingsFromEnv(t *testing.T) {
	dir := t.TempDir()
	master, _ := token.NewMasterKey("k1")
	tok, _ := token.NewSigner(token.PurposeIdentity, master.Derive(token.PurposeIdentity, "", "")).Sign(token.Claims{Tenant: "acme", Env: "dev"}, time.Hour)
	file := filepath.Join(dir, "identity-token")
	os.WriteFile(file, []byte(tok), 0o600)
	base := map[string]string{
		"TALKIDE_TENANT": "acme", "TALKIDE_ENV": "dev", "TALKIDE_WORKER_REQUEST_KEYS": token.FormatKey(master.Derive(token.PurposeWorkerRequest, "acme", "dev")),
		"TALKIDE_GATEWAY_BASE_URL": "http://cp", "TALKIDE_SESSION_DIR": dir, "TALKIDE_CLAUDE_BIN": "/bin/true",
		"TALKIDE_WORKER_IDENTITY_TOKEN": "", "TALKIDE_WORKER_IDENTITY_TOKEN_FILE": "", "TALKIDE_IDENTITY_FAILURE_GRACE": "",
		"TALKIDE_NOOP_UPSTREAM_URL": "",
	}
	cases := []struct {
		name      string
		env       map[string]string
		wantErr   string
		wantGrace time.Duration
	}{
		{"file", map[string]string{"TALKIDE_WORKER_IDENTITY_TOKEN_FILE": file}, "", time.Minute},
		{"file and grace", map[string]string{"TALKIDE_WORKER_IDENTITY_TOKEN_FILE": file, "TALKIDE_IDENTITY_FAILURE_GRACE": "5m"}, "", 5 * time.Minute},
		{"both", map[string]string{"TALKIDE_WORKER_IDENTITY_TOKEN_FILE": file, "TALKIDE_WORKER_IDENTITY_TOKEN": tok}, "not both", 0},
		{"bad grace", map[string]string{"TALKIDE_WORKER_IDENTITY_TOKEN_FILE": file, "TALKIDE_IDENTITY_FAILURE_GRACE": "soon"}, "TALKIDE_IDENTITY_FAILURE_GRACE", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range base {
				t.Setenv(k, v)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			cfg, err := configFromEnv()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("got %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.IdentityTokenFile != file || cfg.IdentityFailureGrace != tc.wantGrace {
				t.Errorf("got file %q grace %s, want %q and %s", cfg.IdentityTokenFile, cfg.IdentityFailureGrace, file, tc.wantGrace)
			}
		})
	}
}
