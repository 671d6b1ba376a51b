package worker_test

import (
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker"
)

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
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate: got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
