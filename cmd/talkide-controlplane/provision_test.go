package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/token"
)

// The operator commands provision, status, rotate-identity and deprovision
// drive the real test cluster through KUBECONFIG, with the database and
// master keys of the other commands, and print the status as JSON.
func TestProvisioningCommands(t *testing.T) {
	c := kubetest.Shared(t)
	mk, _ := token.NewMasterKey("k1")
	t.Setenv("TALKIDE_MASTER_KEYS", mk.String())
	t.Setenv("TALKIDE_DB_PATH", filepath.Join(t.TempDir(), "cp.db"))
	t.Setenv("TALKIDE_DATABASE_URL", "")
	t.Setenv("KUBECONFIG", c.Kubeconfig())
	t.Setenv("TALKIDE_WORKER_IMAGE", "")
	t.Setenv("TALKIDE_PROVISION_WAIT", "5s")
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	run := func(args ...string) (provision.Status, error) {
		var out bytes.Buffer
		_, err := command(ctx, args, &out, log)
		var st provision.Status
		if out.Len() > 0 {
			if jerr := json.Unmarshal(out.Bytes(), &st); jerr != nil {
				t.Fatalf("%v: output is not a status: %q", args, out.String())
			}
		}
		return st, err
	}
	tn := "cmd" + strings.ToLower(token.NewID()[:6])
	t.Cleanup(func() {
		c.Client().CoreV1().Namespaces().Delete(context.Background(), tn+"-dev", metav1.DeleteOptions{})
	})
	if _, err := run("provision", "-tenant", tn, "-env", "dev"); err == nil || !strings.Contains(err.Error(), "TALKIDE_WORKER_IMAGE") {
		t.Fatalf("provision without an image: %v", err)
	}
	if _, err := run("provision", "-tenant", "Not/A", "-env", "dev"); err == nil {
		t.Fatal("provision accepted a malformed tenant")
	}
	if st, err := run("status", "-tenant", tn, "-env", "dev"); err != nil || st.Phase != provision.PhaseAbsent {
		t.Fatalf("status before: %+v %v", st, err)
	}
	t.Setenv("TALKIDE_WORKER_IMAGE", "example.invalid/talkide-worker:test")
	st, err := run("provision", "-tenant", tn, "-env", "dev", "-wait", "2m")
	if err != nil || st.Phase != provision.PhaseReady || st.Identity == nil {
		t.Fatalf("provision -wait: %+v %v", st, err)
	}
	if _, err := c.Client().AppsV1().Deployments(tn+"-dev").Get(ctx, provision.WorkerName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	rot, err := run("rotate-identity", "-tenant", tn, "-env", "dev")
	if err != nil || rot.Identity == nil || rot.Identity.JTI == st.Identity.JTI || len(rot.Identity.Retiring) != 1 {
		t.Fatalf("rotate-identity: %+v %v", rot.Identity, err)
	}
	st, err = run("deprovision", "-tenant", tn, "-env", "dev")
	if err != nil || (st.Phase != provision.PhaseAbsent && st.Phase != provision.PhaseDeprovisioning) {
		t.Fatalf("deprovision: %+v %v", st, err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		_, err := c.Client().CoreV1().Namespaces().Get(ctx, tn+"-dev", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace still there after deprovision: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if st, err := run("rotate-identity", "-tenant", tn, "-env", "dev"); err == nil {
		t.Fatalf("rotate-identity after deprovision: %+v", st)
	}

	// Bad settings are configuration errors (exit code contract.ExitConfig).
	t.Setenv("TALKIDE_IDENTITY_ROTATION_GRACE", "40d")
	if _, err := run("status", "-tenant", tn, "-env", "dev"); !errors.As(err, new(*contract.ConfigError)) {
		t.Fatalf("a grace longer than the rotation lead: %v", err)
	}
}

// `talkide-controlplane clusterrole` prints the ClusterRole the provisioner
// is tested with.
func TestClusterRoleCommand(t *testing.T) {
	var out bytes.Buffer
	if _, err := command(context.Background(), []string{"clusterrole"}, &out, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(out.String(), "\n---\n")
	if len(docs) != 5 {
		t.Fatalf("want the ClusterRole and two admission policies with their bindings; got %d documents:\n%s", len(docs), out.String())
	}
	var cr rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &cr); err != nil {
		t.Fatalf("%v in %s", err, docs[0])
	}
	if cr.Kind != "ClusterRole" || cr.Name != provision.ClusterRoleName || !reflect.DeepEqual(cr.Rules, provision.ClusterRole().Rules) {
		t.Fatalf("printed %+v", cr)
	}
	var pol admissionv1.ValidatingAdmissionPolicy
	if err := yaml.UnmarshalStrict([]byte(docs[1]), &pol); err != nil || pol.Name != provision.ScopePolicyName || len(pol.Spec.Validations) == 0 {
		t.Fatalf("scope policy %v: %s", err, docs[1])
	}
}
