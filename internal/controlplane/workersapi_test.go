package controlplane

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/token"
)

// The provisioning admin API needs the admin token and says clearly when
// provisioning is off; a malformed name is a 400. (With a cluster it is
// driven in internal/controlplane/provision's lifecycle test.)
func TestWorkersAPIWithoutProvisioner(t *testing.T) {
	f := startControlPlaneWith(t, func(c *Config) { c.AdminToken = adminToken })
	do := func(method, path, tok string) (int, contract.ErrorBody) {
		t.Helper()
		req, _ := http.NewRequest(method, f.url+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var e contract.ErrorBody
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("%s %s: body %q is not the error shape", method, path, b)
		}
		return resp.StatusCode, e
	}
	for _, m := range []string{"PUT", "GET", "DELETE"} {
		if code, e := do(m, "/api/admin/workers/acme/dev", ""); code != 401 || e.Error.Type != contract.ErrTypeUnauthorized {
			t.Errorf("%s without the admin token: %d %+v", m, code, e)
		}
	}
	if code, e := do("PUT", "/api/admin/workers/acme/dev", adminToken); code != 404 || !strings.Contains(e.Error.Message, "TALKIDE_PROVISIONER=kubernetes") {
		t.Errorf("provisioning off: %d %+v", code, e)
	}
	if code, e := do("GET", "/api/admin/workers", adminToken); code != 404 || e.Error.Type != contract.ErrTypeNotFound {
		t.Errorf("list with provisioning off: %d %+v", code, e)
	}
}

// Turning provisioning on without a worker image is a configuration
// error, as is an unknown provisioner.
func TestProvisionerConfig(t *testing.T) {
	c := Config{MasterKeys: cfgMasterKeys(t), Provisioner: "kubernetes"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "TALKIDE_WORKER_IMAGE") {
		t.Errorf("no image: %v", err)
	}
	c = Config{MasterKeys: cfgMasterKeys(t), Provisioner: "nomad"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "TALKIDE_PROVISIONER") {
		t.Errorf("unknown provisioner: %v", err)
	}
	c = Config{MasterKeys: cfgMasterKeys(t)}
	c.ForProvisionerCommand()
	if err := c.Validate(); err != nil || c.Provision.WorkerURLTemplate != c.WorkerURLTemplate {
		t.Errorf("a status command needs no image: %v (%q)", err, c.Provision.WorkerURLTemplate)
	}
}

func cfgMasterKeys(t *testing.T) []token.MasterKey {
	mk, err := token.NewMasterKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	return []token.MasterKey{mk}
}
