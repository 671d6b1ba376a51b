package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/token"
)

func TestIdentitySettingsFromEnv(t *testing.T) {
	dir := t.TempDir()
	master, _ := token.NewMasterKey("k1")
	tok, _ := token.NewSigner(token.PurposeIdentity, master.Derive(token.PurposeIdentity, "", "")).Sign(token.Claims{Tenant: "acme", Env: "dev"}, time.Hour)
	file := filepath.Join(dir, "identity-token")
	os.WriteFile(file, []byte(tok), 0o600)
	base := map[string]string{
		"TALKIDE_TENANT": "acme", "TALKIDE_ENV": "dev", "TALKIDE_WORKER_REQUEST_KEYS": token.FormatKey(master.Derive(token.PurposeWorkerRequest, "acme", "dev")),
		"TALKIDE_GATEWAY_BASE_URL": "http://cp", "TALKIDE_SESSION_DIR": dir, "TALKIDE_CLAUDE_BIN": "/bin/true",
		"TALKIDE_WORKER_IDENTITY_TOKEN": "", "TALKIDE_WORKER_IDENTITY_TOKEN_FILE": "",
		"TALKIDE_NOOP_UPSTREAM_URL": "",
	}
	cases := []struct {
		name    string
		env     map[string]string
		wantErr string
	}{
		{"file", map[string]string{"TALKIDE_WORKER_IDENTITY_TOKEN_FILE": file}, ""},
		{"both", map[string]string{"TALKIDE_WORKER_IDENTITY_TOKEN_FILE": file, "TALKIDE_WORKER_IDENTITY_TOKEN": tok}, "not both"},
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
			if cfg.IdentityTokenFile != file {
				t.Errorf("IdentityTokenFile: got %q, want %q", cfg.IdentityTokenFile, file)
			}
		})
	}
}
