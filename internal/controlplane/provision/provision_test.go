package provision_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/token"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// rig is one control plane's provisioner over a database, against the
// shared test cluster.
type rig struct {
	t       *testing.T
	cluster *kubetest.Cluster
	kube    kubernetes.Interface
	db      *controlstore.DB
	master  token.MasterKey
	mint    *mint.Handler
	cfg     provision.Config
	p       *provision.K8sWorkerProvisioner
}

func newRig(t *testing.T, adjust ...func(*provision.Config)) *rig {
	t.Helper()
	c := kubetest.Shared(t)
	db, err := controlstore.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	mk, err := token.NewMasterKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, cluster: c, kube: c.Client(), db: db, master: mk}
	r.mint = mint.New(db, mk, slog.New(slog.DiscardHandler))
	inst := make([]byte, 3)
	rand.Read(inst)
	r.cfg = provision.Config{
		// An installation of its own: the resync of one test never
		// removes another test's workers.
		Installation: "i" + hex.EncodeToString(inst),
		Image:        "example.invalid/talkide-worker:test", ControlPlaneNamespace: "talkide-system",
		TerminatingWait: 2 * time.Second, Logger: testLogger(t),
	}
	for _, f := range adjust {
		f(&r.cfg)
	}
	r.p = r.another(r.kube)
	return r
}

// another is a second control plane (or the same one restarted) sharing
// the rig's database and master key, talking to the cluster through kube.
func (r *rig) another(kube kubernetes.Interface) *provision.K8sWorkerProvisioner {
	r.t.Helper()
	p, err := provision.New(r.cfg, kube, r.db, r.mint, []token.MasterKey{r.master})
	if err != nil {
		r.t.Fatal(err)
	}
	return p
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, nil)).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// tenant returns a fresh tenant name, so tests sharing the cluster never
// meet; its namespaces are deleted when t ends.
func (r *rig) tenant() string {
	b := make([]byte, 3)
	rand.Read(b)
	name := "t" + hex.EncodeToString(b)
	r.t.Cleanup(func() {
		for _, env := range []string{"dev", "prod"} {
			r.kube.CoreV1().Namespaces().Delete(context.Background(), provision.Namespace(name, env), metav1.DeleteOptions{})
		}
	})
	return name
}

// provisioned provisions a fresh tenant's env "dev" and returns the tenant
// and its namespace.
func (r *rig) provisioned() (tenant, ns string) {
	r.t.Helper()
	tenant = r.tenant()
	if _, err := r.p.Provision(context.Background(), tenant, "dev"); err != nil {
		r.t.Fatal(err)
	}
	return tenant, tenant + "-dev"
}

func (r *rig) waitFor(what string, timeout time.Duration, cond func() (bool, error)) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	r.t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, last)
}

func (r *rig) waitPhase(tenant, env, phase string) provision.Status {
	r.t.Helper()
	var st provision.Status
	r.waitFor(fmt.Sprintf("%s/%s phase %s", tenant, env, phase), 90*time.Second, func() (bool, error) {
		var err error
		st, err = r.p.Status(context.Background(), tenant, env)
		if err == nil && st.Phase != phase {
			err = fmt.Errorf("phase %s (%s: %s)", st.Phase, st.Reason, st.Message)
		}
		return err == nil, err
	})
	return st
}

func (r *rig) namespaceGone(ns string) {
	r.t.Helper()
	r.waitFor("namespace "+ns+" gone", 90*time.Second, func() (bool, error) {
		_, err := r.kube.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
}

// identityStatus asks the mint whether tok is a valid identity token: a
// valid one gets 403 for a conversation that does not exist, a refused
// one 401.
func (r *rig) identityValid(tok string) bool {
	r.t.Helper()
	code := mintCode(r.t, r.mint, tok)
	switch code {
	case 403:
		return true
	case 401:
		return false
	}
	r.t.Fatalf("mint answered %d", code)
	return false
}

func secretToken(t *testing.T, kube kubernetes.Interface, ns string) string {
	t.Helper()
	s, err := kube.CoreV1().Secrets(ns).Get(context.Background(), provision.SecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(s.Data[provision.SecretKeyID])
}

func reasonOf(err error) string {
	var pe *provision.Error
	if errors.As(err, &pe) {
		return pe.Reason
	}
	return ""
}

// The provisioner makes every object of the design, as specified, and a
// second provision changes nothing.
const testBuildImage = "registry.example/talkide-builder-gradle@sha256:00000000000000000000000000000000000000000000000000000000000000b1"

// TestBuildImageSetting: the build image is optional, must be pinned by
// digest when set, and only BuildImage sets the worker's
// TALKIDE_BUILD_IMAGE (not TALKIDE_WORKER_ENV).
func TestBuildImageSetting(t *testing.T) {
	for image, ok := range map[string]bool{
		"": true, testBuildImage: true,
		"registry.example/talkide-builder-gradle:1.0":                             false,
		"registry.example/talkide-builder-gradle@sha256:abc":                      false,
		"sha256:00000000000000000000000000000000000000000000000000000000000000b1": false,
	} {
		c := provision.Config{Image: "example.invalid/w:1", BuildImage: image}
		if err := c.Validate(); (err == nil) != ok {
			t.Errorf("BuildImage %q: Validate %v, want ok=%v", image, err, ok)
		} else if err != nil && !strings.Contains(err.Error(), "TALKIDE_WORKER_BUILD_IMAGE") {
			t.Errorf("BuildImage %q: %v, want the setting named", image, err)
		}
	}
	if _, err := provision.ParseEnv("TALKIDE_BUILD_IMAGE=" + testBuildImage); err == nil {
		t.Error("TALKIDE_WORKER_ENV may set TALKIDE_BUILD_IMAGE; want it refused (TALKIDE_WORKER_BUILD_IMAGE sets it)")
	}
}

func TestProvisionMakesTheWorkersObjects(t *testing.T) {
	r := newRig(t, func(c *provision.Config) { c.BuildImage = testBuildImage })
	ctx := context.Background()
	tn := r.tenant()
	ns := provision.Namespace(tn, "dev")
	st, err := r.p.Provision(ctx, tn, "dev")
	if err != nil {
		t.Fatalf("provision: %v (%+v)", err, st)
	}
	// Progressing, or already Ready (kwok's pods are ready at once).
	if st.Phase == provision.PhaseFailed || st.Phase == provision.PhaseAbsent || st.Phase == provision.PhaseDeprovisioning {
		t.Fatalf("right after provision: phase %s (%s)", st.Phase, st.Message)
	}
	if want := "http://talkide-worker." + ns + ".svc.cluster.local:8080"; st.WorkerURL != want {
		t.Errorf("worker URL %q, want %q", st.WorkerURL, want)
	}
	st = r.waitPhase(tn, "dev", provision.PhaseReady)
	if st.Identity == nil || st.ReadyReplicas != 1 || st.Image != r.cfg.Image {
		t.Errorf("ready status: %+v", st)
	}

	// The Role grants exactly the worker's rights, to its ServiceAccount.
	role, err := r.kube.RbacV1().Roles(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(role.Rules, provision.WorkerRules()) {
		t.Errorf("role rules %+v", role.Rules)
	}
	rb, err := r.kube.RbacV1().RoleBindings(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
	if err != nil || len(rb.Subjects) != 1 || rb.Subjects[0].Name != provision.WorkerName || rb.RoleRef.Name != provision.WorkerName {
		t.Errorf("role binding %+v %v", rb, err)
	}
	// The identity token in the Secret is this tenant-env's, and the mint
	// takes it.
	tok := secretToken(t, r.kube, ns)
	c, err := token.NewVerifier(token.PurposeIdentity, r.master.Derive(token.PurposeIdentity, "", "")).ForSubject(tn, "dev").Verify(tok)
	if err != nil || c.ID != st.Identity.JTI {
		t.Fatalf("identity token: %v (jti %v, status %v)", err, c, st.Identity)
	}
	if !r.identityValid(tok) {
		t.Fatal("the mint refuses the provisioned identity token")
	}
	// The claim is ReadWriteMany and bound; the Deployment's pod has what
	// containment needs and the session volume at /data/claude.
	pvc, err := r.kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, provision.PVCName, metav1.GetOptions{})
	if err != nil || !slices.Equal(pvc.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}) || pvc.Status.Phase != corev1.ClaimBound {
		t.Errorf("pvc %+v %v", pvc, err)
	}
	dep, err := r.kube.AppsV1().Deployments(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := dep.Spec.Template.Spec
	ctr := pod.Containers[0]
	if pod.HostUsers == nil || !*pod.HostUsers || ctr.SecurityContext.ProcMount != nil ||
		pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeUnconfined || pod.ServiceAccountName != provision.WorkerName {
		t.Errorf("pod security: %+v %+v", pod.SecurityContext, ctr.SecurityContext)
	}
	if ctr.ReadinessProbe.HTTPGet.Path != "/readyz" || ctr.LivenessProbe.HTTPGet.Path != "/healthz" || ctr.Resources.Limits.Memory().IsZero() {
		t.Errorf("probes or resources: %+v %+v %+v", ctr.ReadinessProbe, ctr.LivenessProbe, ctr.Resources)
	}
	mounts := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if mounts["sessions"] != "/data/claude" || mounts["identity"] != provision.IdentityMount || mounts["host-uids"] != "/run/talkide/uids" {
		t.Errorf("mounts %v", mounts)
	}
	env := map[string]string{}
	for _, e := range ctr.Env {
		env[e.Name] = e.Value
	}
	if env["TALKIDE_TENANT"] != tn || env["TALKIDE_ENV"] != "dev" || env["TALKIDE_WORKER_IDENTITY_TOKEN_FILE"] != provision.IdentityMount+"/identity-token" ||
		env["TALKIDE_LEASE_BACKEND"] != "kubernetes" || env["TALKIDE_SESSION_DIR"] != "/data/claude" || env["TALKIDE_BUILD_IMAGE"] != testBuildImage {
		t.Errorf("env %v", env)
	}
	if dep.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("strategy %+v", dep.Spec.Strategy)
	}
	np, err := r.kube.NetworkingV1().NetworkPolicies(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
	if err != nil || len(np.Spec.PolicyTypes) != 2 || len(np.Spec.Ingress) != 1 {
		t.Errorf("network policy %+v %v", np, err)
	}
	if _, err := r.kube.CoreV1().Services(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{}); err != nil {
		t.Error(err)
	}

	// Provisioning again is a no-op: no object changes, no token is
	// minted.
	before := resourceVersions(t, r.kube, ns)
	if _, err := r.p.Provision(ctx, tn, "dev"); err != nil {
		t.Fatal(err)
	}
	if err := r.p.ReconcileAll(ctx); err != nil {
		t.Fatal(err)
	}
	if after := resourceVersions(t, r.kube, ns); !reflect.DeepEqual(before, after) {
		t.Errorf("a second provision changed objects:\nbefore %v\nafter  %v", before, after)
	}
	if toks, _ := r.db.LiveIdentityTokens(ctx, tn, "dev"); len(toks) != 1 {
		t.Errorf("%d live identity tokens after re-provisioning, want 1", len(toks))
	}
}

// resourceVersions of the worker's objects, by kind.
func resourceVersions(t *testing.T, kube kubernetes.Interface, ns string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	get := func(kind string, obj metav1.Object, err error) {
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		out[kind] = obj.GetResourceVersion()
	}
	n, err := kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	get("Namespace", n, err)
	s, err := kube.CoreV1().Secrets(ns).Get(ctx, provision.SecretName, metav1.GetOptions{})
	get("Secret", s, err)
	sa, err := kube.CoreV1().ServiceAccounts(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
	get("ServiceAccount", sa, err)
	ro, err := kube.RbacV1().Roles(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
	get("Role", ro, err)
	rb, err := kube.RbacV1().RoleBindings(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
	get("RoleBinding", rb, err)
	svc, err := kube.CoreV1().Services(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
	get("Service", svc, err)
	np, err := kube.NetworkingV1().NetworkPolicies(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
	get("NetworkPolicy", np, err)
	d, err := kube.AppsV1().Deployments(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out["Deployment.generation"] = fmt.Sprint(d.Generation)
	return out
}

// Deprovisioning removes the namespace with everything in it and revokes
// the identity token; another tenant-env is untouched.
func TestDeprovisionRemovesEverythingAndRevokes(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	tn := r.tenant()
	for _, env := range []string{"dev", "prod"} {
		if _, err := r.p.Provision(ctx, tn, env); err != nil {
			t.Fatal(err)
		}
	}
	r.waitPhase(tn, "prod", provision.PhaseReady)
	devTok, prodTok := secretToken(t, r.kube, tn+"-dev"), secretToken(t, r.kube, tn+"-prod")
	prodBefore := resourceVersions(t, r.kube, tn+"-prod")
	st, err := r.p.Deprovision(ctx, tn, "dev")
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != provision.PhaseAbsent && st.Phase != provision.PhaseDeprovisioning {
		t.Fatalf("after deprovision: %+v", st)
	}
	if r.identityValid(devTok) {
		t.Error("the deprovisioned worker's identity token is still accepted")
	}
	r.namespaceGone(tn + "-dev")
	if err := r.p.ReconcileAll(ctx); err != nil {
		t.Fatal(err)
	}
	st = r.waitPhase(tn, "dev", provision.PhaseAbsent)
	if st.Desired != "" {
		t.Errorf("record left after the deprovision finished: %+v", st)
	}
	if _, err := r.db.WorkerRecord(ctx, tn, "dev"); !errors.Is(err, controlstore.ErrNotFound) {
		t.Errorf("worker record: %v", err)
	}
	if !r.identityValid(prodTok) || !reflect.DeepEqual(prodBefore, resourceVersions(t, r.kube, tn+"-prod")) {
		t.Error("the other tenant-env was touched")
	}
	r.waitPhase(tn, "prod", provision.PhaseReady)
}

// A deprovision while a provision is half done (in this control plane, or
// in another one) leaves nothing behind, and the next provision works.
func TestDeprovisionDuringProvision(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	t.Run("same control plane", func(t *testing.T) {
		tn := r.tenant()
		reached, release := make(chan struct{}), make(chan struct{})
		r.p.SetAfterStep(func(ctx context.Context, tenant, env, step string) error {
			if tenant == tn && step == "secret" {
				close(reached)
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
		defer r.p.SetAfterStep(nil)
		done := make(chan error, 1)
		go func() { _, err := r.p.Provision(ctx, tn, "dev"); done <- err }()
		<-reached
		if _, err := r.p.Deprovision(ctx, tn, "dev"); err != nil {
			t.Fatal(err)
		}
		if err := <-done; reasonOf(err) != provision.ReasonSuperseded {
			t.Fatalf("the interrupted provision returned %v, want Superseded", err)
		}
		close(release)
		r.expectNothingOf(tn, "dev")
		r.p.SetAfterStep(nil)
		if _, err := r.p.Provision(ctx, tn, "dev"); err != nil {
			t.Fatal(err)
		}
		r.waitPhase(tn, "dev", provision.PhaseReady)
	})
	t.Run("another control plane", func(t *testing.T) {
		tn := r.tenant()
		a := r.another(r.kube)
		reached, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		a.SetAfterStep(func(ctx context.Context, tenant, env, step string) error {
			if tenant == tn && step == "namespace" {
				once.Do(func() {
					close(reached)
					<-release
				})
			}
			return nil
		})
		done := make(chan error, 1)
		go func() { _, err := a.Provision(ctx, tn, "dev"); done <- err }()
		<-reached
		// B deprovisions and finishes while A is paused.
		if _, err := r.p.Deprovision(ctx, tn, "dev"); err != nil {
			t.Fatal(err)
		}
		r.namespaceGone(tn + "-dev")
		if err := r.p.ReconcileAll(ctx); err != nil {
			t.Fatal(err)
		}
		close(release)
		if err := <-done; err == nil {
			t.Fatal("the overtaken provision succeeded")
		}
		// Whatever A made meanwhile is the resync's to remove.
		if err := a.ReconcileAll(ctx); err != nil {
			t.Logf("resync: %v", err)
		}
		r.expectNothingOf(tn, "dev")
		if _, err := a.Provision(ctx, tn, "dev"); err != nil {
			t.Fatal(err)
		}
		r.waitPhase(tn, "dev", provision.PhaseReady)
	})
}

// expectNothingOf waits until neither the cluster nor the database holds
// anything of tenant/env: no namespace, no live identity token, no record.
func (r *rig) expectNothingOf(tenant, env string) {
	r.t.Helper()
	ctx := context.Background()
	r.waitFor("nothing left of "+tenant+"/"+env, 90*time.Second, func() (bool, error) {
		if err := r.p.ReconcileAll(ctx); err != nil {
			return false, err
		}
		if _, err := r.kube.CoreV1().Namespaces().Get(ctx, provision.Namespace(tenant, env), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("namespace still there (%v)", err)
		}
		if toks, err := r.db.LiveIdentityTokens(ctx, tenant, env); err != nil || len(toks) > 0 {
			return false, fmt.Errorf("live identity tokens %v (%v)", toks, err)
		}
		if _, err := r.db.WorkerRecord(ctx, tenant, env); !errors.Is(err, controlstore.ErrNotFound) {
			return false, fmt.Errorf("record still there (%v)", err)
		}
		return true, nil
	})
}

// A control plane that dies mid-provision is carried on by the next one
// from what exists: one of each object, one identity token in use, and the
// token minted by the dead one but never written is revoked.
func TestRestartMidProvisionResumes(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	for _, crashAt := range []string{"namespace", "identity-issued", "secret", "pvc", "network"} {
		t.Run(crashAt, func(t *testing.T) {
			tn := r.tenant()
			dead := r.another(r.kube)
			crash := errors.New("control plane killed")
			dead.SetAfterStep(func(ctx context.Context, tenant, env, step string) error {
				if step == crashAt {
					return crash
				}
				return nil
			})
			if _, err := dead.Provision(ctx, tn, "dev"); !errors.Is(err, crash) {
				t.Fatalf("provision: %v", err)
			}
			next := r.another(r.kube)
			next.SetOrphanAge(0)
			if err := next.ReconcileAll(ctx); err != nil {
				t.Fatal(err)
			}
			st := r.waitPhase(tn, "dev", provision.PhaseReady)
			ns := tn + "-dev"
			sel := provision.LabelTenant + "=" + tn
			deps, _ := r.kube.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
			secs, _ := r.kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
			pvcs, _ := r.kube.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
			rss, _ := r.kube.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
			if len(deps.Items) != 1 || len(secs.Items) != 1 || len(pvcs.Items) != 1 || len(rss.Items) != 1 {
				t.Errorf("objects: %d deployments, %d secrets, %d claims, %d replica sets; want one each", len(deps.Items), len(secs.Items), len(pvcs.Items), len(rss.Items))
			}
			toks, err := r.db.LiveIdentityTokens(ctx, tn, "dev")
			if err != nil || len(toks) != 1 || toks[0].JTI != st.Identity.JTI {
				t.Errorf("live identity tokens %+v (%v), want only the Secret's %v", toks, err, st.Identity)
			}
		})
	}
}

// A namespace stuck terminating is reported with what holds it, not waited
// on forever, and the provision goes through once it is gone.
func TestNamespaceStuckTerminating(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	tn, ns := r.provisioned()
	const hold = "talkide.dev/test-hold"
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "held", Namespace: ns, Finalizers: []string{hold}}}
	if _, err := r.kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := r.p.Deprovision(ctx, tn, "dev")
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != provision.PhaseDeprovisioning {
		t.Fatalf("deprovision of a stuck namespace: %+v", st)
	}
	start := time.Now()
	st, err = r.p.Provision(ctx, tn, "dev")
	if reasonOf(err) != provision.ReasonNamespaceTerminating || st.Phase != provision.PhaseFailed || st.Reason != provision.ReasonNamespaceTerminating {
		t.Fatalf("provision into a terminating namespace: %v, %+v", err, st)
	}
	if took := time.Since(start); took > r.cfg.TerminatingWait+30*time.Second {
		t.Errorf("provision waited %s", took)
	}
	t.Logf("reported: %s", st.Message)
	// The namespace controller says what is left; the message carries it.
	r.waitFor("the status to name what holds the namespace", 60*time.Second, func() (bool, error) {
		st, err := r.p.Status(ctx, tn, "dev")
		return err == nil && st.Phase == provision.PhaseFailed && strings.Contains(st.Message, hold), fmt.Errorf("%+v %v", st, err)
	})
	// Let it go: the resync provisions.
	if _, err := r.kube.CoreV1().ConfigMaps(ns).Patch(ctx, "held", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor("the resync to provision again", 90*time.Second, func() (bool, error) {
		err := r.p.ReconcileAll(ctx)
		return err == nil, err
	})
	r.waitPhase(tn, "dev", provision.PhaseReady)
}

// A provision while the previous session volume's claim is still being
// deleted refuses clearly, and succeeds with a new claim once it is gone.
func TestProvisionWhilePVCDeleting(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	tn, ns := r.provisioned()
	pvcs := r.kube.CoreV1().PersistentVolumeClaims(ns)
	old, err := pvcs.Patch(ctx, provision.PVCName, types.MergePatchType, []byte(`{"metadata":{"finalizers":["talkide.dev/test-hold"]}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := pvcs.Delete(ctx, provision.PVCName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := r.p.Provision(ctx, tn, "dev")
	if reasonOf(err) != provision.ReasonPVCTerminating || st.Phase != provision.PhaseFailed || st.Reason != provision.ReasonPVCTerminating {
		t.Fatalf("provision with the claim deleting: %v, %+v", err, st)
	}
	// The old worker goes (its pod held the claim: kubernetes.io/pvc-protection)
	// and the finalizer is lifted; the provision then makes a new claim
	// and a new Deployment.
	if err := r.kube.AppsV1().Deployments(ns).Delete(ctx, provision.WorkerName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pvcs.Patch(ctx, provision.PVCName, types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers/0"}]`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor("the claim to go or be made anew", 60*time.Second, func() (bool, error) {
		_, err := r.p.Provision(ctx, tn, "dev")
		return err == nil, err
	})
	cur, err := pvcs.Get(ctx, provision.PVCName, metav1.GetOptions{})
	if err != nil || cur.UID == old.UID {
		t.Fatalf("claim after: %v (same uid: %v)", err, err == nil && cur.UID == old.UID)
	}
	r.waitPhase(tn, "dev", provision.PhaseReady)
}

// The status is read from the cluster: objects deleted behind the
// provisioner's back never show as ready, and the resync makes them again.
func TestStatusNeverReadyWhenObjectsAreGone(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	tn, ns := r.provisioned()
	r.waitPhase(tn, "dev", provision.PhaseReady)
	if err := r.kube.AppsV1().Deployments(ns).Delete(ctx, provision.WorkerName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := r.p.Status(ctx, tn, "dev")
	if err != nil || st.Phase == provision.PhaseReady || !slices.Contains(st.Missing, "Deployment/talkide-worker") {
		t.Fatalf("status with the Deployment gone: %+v %v", st, err)
	}
	if err := r.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err = r.p.Status(ctx, tn, "dev")
	if err != nil || st.Phase == provision.PhaseReady {
		t.Fatalf("status with the namespace deleted: %+v %v", st, err)
	}
	r.namespaceGone(ns)
	st, _ = r.p.Status(ctx, tn, "dev")
	if st.Phase == provision.PhaseReady || st.Phase == provision.PhaseAbsent {
		t.Fatalf("status with the namespace gone: %+v", st)
	}
	if err := r.p.ReconcileAll(ctx); err != nil {
		t.Fatal(err)
	}
	r.waitPhase(tn, "dev", provision.PhaseReady)
}

// The status compares the worker with what the operator configured, not
// with the Deployment's own count: scaled to zero behind the provisioner's
// back, it is not Ready with no worker (issue 27, fault 1), and a
// reconcile restores it.
func TestStatusNotReadyWhenScaledBehindItsBack(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	tn, ns := r.provisioned()
	r.waitPhase(tn, "dev", provision.PhaseReady)
	scale, err := r.kube.AppsV1().Deployments(ns).GetScale(ctx, provision.WorkerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	scale.Spec.Replicas = 0
	if _, err := r.kube.AppsV1().Deployments(ns).UpdateScale(ctx, provision.WorkerName, scale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Once the Deployment controller has scaled it down.
	r.waitFor("the Deployment at 0 replicas", 90*time.Second, func() (bool, error) {
		d, err := r.kube.AppsV1().Deployments(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
		return err == nil && d.Status.ObservedGeneration >= d.Generation && d.Status.Replicas == 0, err
	})
	st, err := r.p.Status(ctx, tn, "dev")
	if err != nil || st.Phase == provision.PhaseReady || st.Replicas != 1 || !strings.Contains(st.Message, "0 replicas") {
		t.Fatalf("status scaled to zero: %+v %v", st, err)
	}
	if err := r.p.ReconcileAll(ctx); err != nil {
		t.Fatal(err)
	}
	r.waitPhase(tn, "dev", provision.PhaseReady)
}

// A namespace the provisioner did not make is never adopted nor deleted,
// even when a tenant-env's name lands on it ("a-b"/"c" and "a"/"b-c" share
// namespace "a-b-c").
func TestForeignNamespaceIsLeftAlone(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	tn := r.tenant()
	foreign := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tn + "-x-y"}}
	if _, err := r.kube.CoreV1().Namespaces().Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.kube.CoreV1().Namespaces().Delete(context.Background(), foreign.Name, metav1.DeleteOptions{})
	})
	if _, err := r.p.Provision(ctx, tn+"-x", "y"); reasonOf(err) != provision.ReasonNamespaceConflict {
		t.Fatalf("provision over a foreign namespace: %v", err)
	}
	if _, err := r.db.WorkerRecord(ctx, tn+"-x", "y"); !errors.Is(err, controlstore.ErrNotFound) {
		t.Errorf("a refused provision left a record the resync would retry forever: %v", err)
	}
	if _, err := r.p.Deprovision(ctx, tn+"-x", "y"); reasonOf(err) != provision.ReasonNamespaceConflict {
		t.Fatalf("deprovision of a foreign namespace: %v", err)
	}
	r.p.ReconcileAll(ctx)
	if ns, err := r.kube.CoreV1().Namespaces().Get(ctx, foreign.Name, metav1.GetOptions{}); err != nil || ns.DeletionTimestamp != nil || len(ns.Labels) > 1 {
		t.Fatalf("the foreign namespace was touched: %+v %v", ns, err)
	}
	// Two tenant-envs with one namespace name: the second is refused.
	if _, err := r.p.Provision(ctx, tn+"-a", "b-c"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.p.Provision(ctx, tn, "a-b-c"); reasonOf(err) != provision.ReasonNamespaceConflict {
		t.Fatalf("second tenant-env on one namespace: %v", err)
	}
	t.Cleanup(func() { r.p.Deprovision(context.Background(), tn+"-a", "b-c") })
}

// mintCode is the mint's status for a mint request with identity token tok
// for a conversation that does not exist.
func mintCode(t *testing.T, h http.Handler, tok string) int {
	t.Helper()
	req := httptest.NewRequest("POST", contract.PathMint, strings.NewReader(`{"conversation_id":"c-doesnotexist"}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

// A second control plane with another database (an empty or restored one,
// configured with the same installation name) neither removes nor adopts
// the first one's workers: they carry the first database's id.
func TestAnotherDatabaseLeavesTheWorkersAlone(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	tn := r.tenant()
	if _, err := r.p.Provision(ctx, tn, "dev"); err != nil {
		t.Fatal(err)
	}
	other := newRig(t, func(c *provision.Config) { c.Installation = r.cfg.Installation })
	if err := other.p.ReconcileAll(ctx); err != nil {
		t.Fatal(err)
	}
	ns, err := r.kube.CoreV1().Namespaces().Get(ctx, tn+"-dev", metav1.GetOptions{})
	if err != nil || ns.DeletionTimestamp != nil {
		t.Fatalf("the other database's resync touched the namespace: %v %v", err, ns.DeletionTimestamp)
	}
	if _, err := other.p.Provision(ctx, tn, "dev"); reasonOf(err) != provision.ReasonNamespaceConflict {
		t.Fatalf("provision from another database: %v, want NamespaceConflict", err)
	}
	if _, err := other.p.Deprovision(ctx, tn, "dev"); reasonOf(err) != provision.ReasonNamespaceConflict {
		t.Fatalf("deprovision from another database: %v, want NamespaceConflict", err)
	}
	r.waitPhase(tn, "dev", provision.PhaseReady)
}

// A Secret deleted behind the provisioner's back is made again with a new
// token, and the token the running pods still have mounted keeps its grace.
func TestDeletedSecretKeepsTheMountedTokenForItsGrace(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	tn, ns := r.provisioned()
	mounted := secretToken(t, r.kube, ns)
	if err := r.kube.CoreV1().Secrets(ns).Delete(ctx, provision.SecretName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.p.SetOrphanAge(0) // an orphan would be revoked at once
	if err := r.p.ReconcileAll(ctx); err != nil {
		t.Fatal(err)
	}
	if fresh := secretToken(t, r.kube, ns); fresh == mounted || !r.identityValid(fresh) {
		t.Fatal("the Secret was not made again with a new valid token")
	}
	if !r.identityValid(mounted) {
		t.Fatal("the token still mounted in the pods was revoked without a grace")
	}
	st, _ := r.p.Status(ctx, tn, "dev")
	if st.Identity == nil || len(st.Identity.Retiring) != 1 {
		t.Fatalf("status: %+v", st.Identity)
	}
}

// During a rolling update of the control plane its old and new replicas
// both run, sharing the database: the old ones must not put the old worker
// image back at each resync (every worker would roll back and forth until
// the last old replica stopped). A control plane of a newer configuration
// revision takes the workers over; the older one's resync leaves them, and
// a provision through it is recorded and refused with OutdatedConfig.
func TestOlderConfigurationLeavesTheWorkersToTheNewer(t *testing.T) {
	r := newRig(t, func(c *provision.Config) { c.ConfigRevision = 3; c.Image = "example.invalid/talkide-worker:old" })
	ctx := context.Background()
	tn, ns := r.provisioned()
	image := func() string {
		d, err := r.kube.AppsV1().Deployments(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return d.Spec.Template.Spec.Containers[0].Image
	}
	old := r.p
	r.cfg.ConfigRevision, r.cfg.Image = 4, "example.invalid/talkide-worker:new"
	newer := r.another(r.kube)
	if err := newer.ReconcileAll(ctx); err != nil {
		t.Fatal(err)
	}
	if got := image(); got != r.cfg.Image {
		t.Fatalf("the newer control plane's resync left image %s", got)
	}
	if err := old.ReconcileAll(ctx); err != nil {
		t.Fatal(err)
	}
	if got := image(); got != r.cfg.Image {
		t.Fatalf("the older control plane's resync put back image %s", got)
	}
	tn2 := r.tenant()
	if _, err := old.Provision(ctx, tn2, "dev"); reasonOf(err) != provision.ReasonOutdatedConfig {
		t.Fatalf("a provision through the older control plane: %v; want OutdatedConfig", err)
	}
	if st, _ := old.Status(ctx, tn2, "dev"); st.Desired != "present" || st.LastError != "" {
		t.Fatalf("the refused provision was not recorded for the newer one (or recorded as the worker's error): %+v", st)
	}
	if err := newer.ReconcileAll(ctx); err != nil {
		t.Fatal(err)
	}
	r.p = newer
	r.waitPhase(tn2, "dev", provision.PhaseReady)
	r.waitPhase(tn, "dev", provision.PhaseReady)
	// A control plane restarted with the older configuration (a crashed
	// old pod coming back mid-rollout) does not take the workers back.
	r.cfg.ConfigRevision, r.cfg.Image = 3, "example.invalid/talkide-worker:old"
	if err := r.another(r.kube).ReconcileAll(ctx); err != nil {
		t.Fatal(err)
	}
	if got := image(); got != "example.invalid/talkide-worker:new" {
		t.Fatalf("a restarted older control plane put back image %s", got)
	}
}

// A serving control plane of a new revision takes the workers over only
// after it has served for a while (three heartbeats): one that crashes
// soon after each start (a crash loop) never does, so the workers do not
// roll forward and back with each of its restarts.
func TestNewRevisionSettlesBeforeItTakesOver(t *testing.T) {
	r := newRig(t, func(c *provision.Config) { c.ConfigRevision = 3 })
	ctx := context.Background()
	if err := r.p.ReconcileAll(ctx); err != nil { // revision 3 claims
		t.Fatal(err)
	}
	r.cfg.ConfigRevision = 4
	newer := r.another(r.kube)
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- newer.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-stopped; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	r.waitFor("the controller's caches", 60*time.Second, func() (bool, error) { return newer.HasSynced(), nil })
	if _, err := newer.Provision(ctx, r.tenant(), "dev"); reasonOf(err) != provision.ReasonOutdatedConfig || !strings.Contains(err.Error(), "started less than") {
		t.Fatalf("a provision through a control plane still settling while revision 3 runs: %v; want OutdatedConfig", err)
	}
}
