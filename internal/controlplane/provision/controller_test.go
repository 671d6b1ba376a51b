package provision_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/talkide/talkide/internal/controlplane/provision"
)

// writeCounter counts the API requests that change something, by method
// and path, made through the client it wraps.
type writeCounter struct {
	mu     sync.Mutex
	writes []string
	all    atomic.Int64
}

func (w *writeCounter) client(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			w.all.Add(1)
			if req.Method != http.MethodGet {
				w.mu.Lock()
				w.writes = append(w.writes, req.Method+" "+req.URL.Path)
				w.mu.Unlock()
			}
			return rt.RoundTrip(req)
		})
	})
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return kube
}

func (w *writeCounter) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.writes
	w.writes = nil
	return out
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// run runs p's controller until the test ends, and checks that Run
// returns once stopped.
func (r *rig) run(p *provision.K8sWorkerProvisioner) {
	r.t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	r.t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				r.t.Errorf("Run: %v", err)
			}
		case <-time.After(time.Minute):
			r.t.Errorf("Run did not return a minute after it was stopped")
		}
	})
	r.waitFor("the controller's caches", 60*time.Second, func() (bool, error) { return p.HasSynced(), nil })
}

// The controller sees drift as it happens: with the resync an hour away,
// a deleted Service, a removed NetworkPolicy and a Deployment scaled to
// zero behind its back are put back by the watch (issue 27).
func TestControllerRepairsDriftFromTheWatch(t *testing.T) {
	r := newRig(t, func(c *provision.Config) { c.Resync = time.Hour })
	ctx := context.Background()
	r.run(r.p)
	tn, ns := r.provisioned()
	r.waitPhase(tn, "dev", provision.PhaseReady)

	svc, err := r.kube.CoreV1().Services(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	if err := r.kube.CoreV1().Services(ns).Delete(ctx, provision.WorkerName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r.kube.NetworkingV1().NetworkPolicies(ns).Delete(ctx, provision.JobsNetworkPolicyName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor("the Service and NetworkPolicy made again", 60*time.Second, func() (bool, error) {
		s, err := r.kube.CoreV1().Services(ns).Get(ctx, provision.WorkerName, metav1.GetOptions{})
		if err != nil || s.UID == svc.UID {
			return false, fmt.Errorf("service: %v", err)
		}
		_, err = r.kube.NetworkingV1().NetworkPolicies(ns).Get(ctx, provision.JobsNetworkPolicyName, metav1.GetOptions{})
		return err == nil, err
	})
	t.Logf("a deleted Service and NetworkPolicy made again within %v", time.Since(deleted).Round(10*time.Millisecond))

	deps := r.kube.AppsV1().Deployments(ns)
	scaled := time.Now()
	if _, err := deps.Patch(ctx, provision.WorkerName, types.MergePatchType, []byte(`{"spec":{"replicas":0}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor("the Deployment scaled back", 60*time.Second, func() (bool, error) {
		d, err := deps.Get(ctx, provision.WorkerName, metav1.GetOptions{})
		return err == nil && d.Spec.Replicas != nil && *d.Spec.Replicas == 1, err
	})
	t.Logf("a Deployment scaled to zero scaled back within %v", time.Since(scaled).Round(10*time.Millisecond))
	r.waitPhase(tn, "dev", provision.PhaseReady)

	// A worker's namespace deleted behind its back is made again once it
	// is gone, from the namespace's own deletion event.
	if err := r.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.namespaceGoneOrBack(ns)
	r.waitPhase(tn, "dev", provision.PhaseReady)
}

// namespaceGoneOrBack waits until ns has been deleted (it may already
// have been made again).
func (r *rig) namespaceGoneOrBack(ns string) {
	r.t.Helper()
	old, err := r.kube.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
	if err != nil {
		return
	}
	r.waitFor("namespace "+ns+" replaced", 120*time.Second, func() (bool, error) {
		cur, err := r.kube.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
		return err == nil && cur.UID != old.UID, err
	})
}

// A reconcile of a worker that is as wanted writes nothing: with the
// controller's caches, an unchanged object is not applied again.
func TestControllerAppliesOnlyWhatDiffers(t *testing.T) {
	r := newRig(t, func(c *provision.Config) { c.Resync = time.Hour })
	ctx := context.Background()
	var w writeCounter
	p := r.another(w.client(t, r.cluster.AdminConfig()))
	tn := r.tenant()
	if _, err := p.Provision(ctx, tn, "dev"); err != nil {
		t.Fatal(err)
	}
	r.run(p)
	r.waitPhase(tn, "dev", provision.PhaseReady)
	w.take()
	if err := p.ReconcileAll(ctx); err != nil {
		t.Fatal(err)
	}
	if got := w.take(); len(got) > 0 {
		t.Errorf("a reconcile of an unchanged worker wrote %d times: %v", len(got), got)
	}
	// A change is applied, and only it.
	if _, err := r.kube.CoreV1().Services(tn+"-dev").Patch(ctx, provision.WorkerName, types.MergePatchType,
		[]byte(`{"spec":{"selector":{"`+provision.LabelName+`":"someone-else"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor("the Service's selector restored", 60*time.Second, func() (bool, error) {
		s, err := r.kube.CoreV1().Services(tn+"-dev").Get(ctx, provision.WorkerName, metav1.GetOptions{})
		return err == nil && s.Spec.Selector[provision.LabelName] == provision.WorkerName, err
	})
	for _, wr := range w.take() {
		if strings.Contains(wr, "/deployments/") || strings.Contains(wr, "/roles/") || strings.Contains(wr, "/networkpolicies/") {
			t.Errorf("repairing the Service also wrote %s", wr)
		}
	}
}

// Run blocks until it is stopped, and returns only once a reconcile in
// flight has returned; after that it makes no request.
func TestControllerLifecycle(t *testing.T) {
	r := newRig(t, func(c *provision.Config) { c.Resync = time.Hour })
	var w writeCounter
	p := r.another(w.client(t, r.cluster.AdminConfig()))
	inStep := make(chan struct{}, 1)
	var stepReturned atomic.Bool
	p.SetAfterStep(func(ctx context.Context, tenant, env, step string) error {
		if step != "rbac" {
			return nil
		}
		select {
		case inStep <- struct{}{}:
		default:
		}
		<-ctx.Done()
		time.Sleep(300 * time.Millisecond)
		stepReturned.Store(true)
		return ctx.Err()
	})
	// A record made without the controller: its reconcile blocks in the
	// hook.
	tn := r.tenant()
	if _, err := r.db.SetWorkerDesired(context.Background(), tn, "dev", "present", time.Now()); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case <-inStep:
	case err := <-done:
		t.Fatalf("Run returned before it was stopped: %v", err)
	case <-time.After(90 * time.Second):
		t.Fatal("the controller never reconciled the recorded tenant-env")
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned before it was stopped: %v", err)
	case <-time.After(time.Second):
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !stepReturned.Load() {
		t.Fatal("Run returned while a reconcile was still running")
	}
	n := w.all.Load()
	time.Sleep(2 * time.Second)
	if after := w.all.Load(); after != n {
		t.Errorf("%d requests after Run returned", after-n)
	}
}

// A rotated identity token is revoked when its grace ends, by the
// controller's requeue at that time, with the resync an hour away.
func TestControllerRevokesARetiredTokenOnTime(t *testing.T) {
	r := newRig(t, func(c *provision.Config) { c.Resync = time.Hour; c.Grace = 3 * time.Second })
	ctx := context.Background()
	r.run(r.p)
	tn, ns := r.provisioned()
	old := secretToken(t, r.kube, ns)
	st, err := r.p.RotateIdentity(ctx, tn, "dev")
	if err != nil || st.Identity == nil || len(st.Identity.Retiring) != 1 {
		t.Fatalf("rotate: %+v %v", st, err)
	}
	jti := st.Identity.Retiring[0].JTI
	r.waitFor("the retired token revoked", 60*time.Second, func() (bool, error) {
		tok, err := r.db.IdentityTokenByID(ctx, jti)
		return err == nil && tok.RevokedAt != nil, err
	})
	if r.identityValid(old) {
		t.Fatal("the retired token still works")
	}
}

// Without the policy that confines the control plane's writes, nothing is
// provisioned (issue 27, fault 7): the control plane's ClusterRole reaches
// every namespace, and only ScopePolicy narrows it. An audit-only binding
// does not count.
func TestScopePolicyIsRequired(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	installScopePolicy(t, r)
	adm := r.kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	restore := func() {
		_, bind := provision.ScopePolicy()
		if cur, err := adm.Get(ctx, bind.Name, metav1.GetOptions{}); err == nil {
			cur.Spec = bind.Spec
			if _, err := adm.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
				t.Error(err)
			}
			return
		}
		if _, err := adm.Create(ctx, bind, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Error(err)
		}
	}
	t.Cleanup(restore)
	kube := r.serviceAccountWith(t, r.cluster.Namespace(t), provision.ControlPlaneServiceAccount, provision.ClusterRole().Rules)

	if err := adm.Delete(ctx, provision.ScopePolicyName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	tn := r.tenant()
	_, err := r.another(kube).Provision(ctx, tn, "dev")
	if reasonOf(err) != provision.ReasonPolicyMissing || !strings.Contains(err.Error(), provision.ScopePolicyName) {
		t.Fatalf("provision without the scope policy's binding: %v; want PolicyMissing naming %s", err, provision.ScopePolicyName)
	}
	if _, err := r.kube.CoreV1().Namespaces().Get(ctx, tn+"-dev", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a namespace was made without the scope policy: %v", err)
	}

	_, bind := provision.ScopePolicy()
	bind.Spec.ValidationActions = []admissionv1.ValidationAction{admissionv1.Audit}
	if _, err := adm.Create(ctx, bind, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.another(kube).Provision(ctx, tn, "dev"); reasonOf(err) != provision.ReasonPolicyMissing || !strings.Contains(err.Error(), "not enforced") {
		t.Fatalf("provision with an audit-only binding: %v; want PolicyMissing", err)
	}
	restore()
	if _, err := r.another(kube).Provision(ctx, tn, "dev"); err != nil {
		t.Fatalf("provision with the policy back: %v", err)
	}
}

// A namespace held by a finalizer on itself (not on an object in it) is
// named in the wait message (issue 27, fault 8).
func TestNamespaceFinalizerIsNamed(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	tn, ns := r.provisioned()
	const hold = "talkide.dev/namespace-hold"
	if _, err := r.kube.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(`{"metadata":{"finalizers":["`+hold+`"]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.kube.CoreV1().Namespaces().Patch(context.Background(), ns, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	if _, err := r.p.Deprovision(ctx, tn, "dev"); err != nil {
		t.Fatal(err)
	}
	r.waitFor("the status to name the namespace's finalizer", 60*time.Second, func() (bool, error) {
		st, err := r.p.Status(ctx, tn, "dev")
		return err == nil && st.Phase == provision.PhaseDeprovisioning && strings.Contains(st.Message, hold), fmt.Errorf("%+v %v", st, err)
	})
	// Content finalizers are named as before, from the namespace
	// controller's conditions; the namespace goes once its own is lifted.
	if _, err := r.kube.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	r.namespaceGone(ns)
}
