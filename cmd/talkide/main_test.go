package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
)

// TestUserAddArguments: the name may come before or after the flags, the
// flags set the grant, and anything else is refused with the usage.
// (internal/localrun's TestUserAddWhileRunning runs the binary against a
// running platform.)
func TestUserAddArguments(t *testing.T) {
	state := t.TempDir()
	t.Setenv("TALKIDE_STATE_DIR", state)
	t.Setenv("TALKIDE_HTTP_ADDR", "127.0.0.1:8097")
	db, err := controlstore.OpenSQLite(t.Context(), filepath.Join(state, "controlplane.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, tc := range []struct {
		args        []string
		user        string
		tenant, env string
	}{
		{[]string{"user", "add", "carol"}, "carol", "demo", "dev"},
		{[]string{"user", "add", "-tenant", "acme", "-env", "prod", "dave"}, "dave", "acme", "prod"},
		{[]string{"user", "add", "erin", "-env", "qa"}, "erin", "demo", "qa"},
	} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), tc.args, &out, &errOut); err != nil {
			t.Errorf("talkide %s: %v", strings.Join(tc.args, " "), err)
			continue
		}
		if !strings.Contains(out.String(), "http://127.0.0.1:8097/#token=tk_") {
			t.Errorf("talkide %s printed no URL on TALKIDE_HTTP_ADDR:\n%s", strings.Join(tc.args, " "), out.String())
		}
		if ok, err := db.HasGrant(t.Context(), tc.user, tc.tenant, tc.env); err != nil || !ok {
			t.Errorf("talkide %s: %s has no grant on %s/%s (%v)", strings.Join(tc.args, " "), tc.user, tc.tenant, tc.env, err)
		}
	}
	for _, args := range [][]string{
		{"user", "add"},
		{"user", "add", "frank", "grace"},
		{"user", "add", "-tenant", "Not A Tenant", "heidi"},
		{"user", "add", " ivan"},
		{"user"},
		{},
	} {
		if err := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("talkide %q: accepted", args)
		}
	}
}
