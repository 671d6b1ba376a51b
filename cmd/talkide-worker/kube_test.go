package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
)

// The real worker binary, with credentials made from its ServiceAccount's
// token as its pod would have them, checks its rights at start: with the
// provisioner's Role it starts, holds its replica Lease in its namespace
// and reports no excess; without the Lease rights it refuses to start
// (exit 78) naming what is missing; with more rights than a worker needs it
// says so.
func TestWorkerChecksItsKubernetesRights(t *testing.T) {
	c := kubetest.Shared(t)
	bin := platformtest.ClaudeBin(t)
	master, _ := token.NewMasterKey("k1")
	env := func(t *testing.T, rules []rbacv1.PolicyRule) []string {
		ns := c.Namespace(t)
		dir := platformtest.AgentReachableTempDir(t)
		sessions := filepath.Join(dir, "sessions")
		if err := os.MkdirAll(sessions, 0o755); err != nil {
			t.Fatal(err)
		}
		return []string{
			"TALKIDE_TENANT=acme", "TALKIDE_ENV=dev", "TALKIDE_WORKER_ADDR=127.0.0.1:0",
			"TALKIDE_WORKER_REQUEST_KEYS=" + token.FormatKey(master.Derive(token.PurposeWorkerRequest, "acme", "dev")),
			"TALKIDE_NOOP_UPSTREAM_URL=http://127.0.0.1:9", "ANTHROPIC_API_KEY=sk-unused",
			"TALKIDE_SESSION_DIR=" + sessions, "TALKIDE_CLAUDE_BIN=" + bin,
			"TALKIDE_HOST_UID_DIR=" + filepath.Join(dir, "uids"), "TALKIDE_CLI_TMP_DIR=" + filepath.Join(dir, "cli-tmp"),
			"TALKIDE_LEASE_BACKEND=kubernetes", "POD_NAMESPACE=" + ns,
			"KUBECONFIG=" + kubetest.WriteKubeconfig(t, c.ServiceAccountConfig(t, ns, provision.WorkerName, rules), ns),
		}
	}

	t.Run("the provisioner's Role", func(t *testing.T) {
		w := startWorkerProcess(t, env(t, provision.WorkerRules()))
		log := w.Log()
		if !strings.Contains(log, "kubernetes rights checked") || strings.Contains(log, "more rights than a worker needs") || strings.Contains(log, "lacks rights") {
			t.Fatalf("worker log:\n%s", log)
		}
	})
	t.Run("no Lease rights", func(t *testing.T) {
		rules := []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "delete"}}}
		self, _ := os.Executable()
		cmd := exec.Command(self)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "TALKIDE_") && !strings.HasPrefix(kv, "ANTHROPIC_") && !strings.HasPrefix(kv, "KUBECONFIG") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(append(cmd.Env, envExecMain+"=1"), env(t, rules)...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != contract.ExitConfig || !strings.Contains(string(out), "may not update leases.coordination.k8s.io") {
			t.Fatalf("exit %v, want %d naming the missing right; output:\n%s", err, contract.ExitConfig, out)
		}
	})
	t.Run("more than a worker needs", func(t *testing.T) {
		rules := append(provision.WorkerRules(), rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}})
		w := startWorkerProcess(t, env(t, rules))
		if log := w.Log(); !strings.Contains(log, "more rights than a worker needs") || !strings.Contains(log, "get secrets") {
			t.Fatalf("worker log does not name the excess right:\n%s", log)
		}
	})
}
