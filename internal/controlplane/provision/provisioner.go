package provision

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/token"
)

// Store is what the provisioner keeps in the control-plane database.
type Store interface {
	SetWorkerDesired(ctx context.Context, tenant, env, desired string, at time.Time) (int64, error)
	WorkerRecord(ctx context.Context, tenant, env string) (controlstore.WorkerRecord, error)
	WorkerRecords(ctx context.Context) ([]controlstore.WorkerRecord, error)
	SetWorkerError(ctx context.Context, tenant, env string, gen int64, msg string) error
	DeleteWorkerRecord(ctx context.Context, tenant, env string, gen int64) error
	IdentityTokenByID(ctx context.Context, jti string) (controlstore.IdentityToken, error)
	LiveIdentityTokens(ctx context.Context, tenant, env string) ([]controlstore.IdentityToken, error)
	RetireIdentityToken(ctx context.Context, jti string, at time.Time) error
	RevokeIdentityToken(ctx context.Context, jti string, at time.Time) error
	SetWorkerIdentity(ctx context.Context, tenant, env, jti string) error
	InstallationID(ctx context.Context) (string, error)
	ClaimConfigRevision(ctx context.Context, rev int64, now time.Time, staleAfter time.Duration) (int64, error)
	ConfigRevision(ctx context.Context, now time.Time) (rev int64, live bool, err error)
}

var _ Store = (*controlstore.DB)(nil)

// Issuer signs and records identity tokens (mint.Handler).
type Issuer interface {
	IssueIdentity(ctx context.Context, tenant, env string, ttl time.Duration) (string, error)
}

// K8sWorkerProvisioner makes, keeps and removes tenant-envs' workers in a
// Kubernetes cluster. Safe for concurrent use, and for several control
// planes sharing one database and cluster: every step is idempotent, and a
// reconcile that a later provision or deprovision overtook stops.
type K8sWorkerProvisioner struct {
	cfg         Config
	kube        kubernetes.Interface
	store       Store
	issuer      Issuer
	idKeys      []token.Key // verify identity tokens
	requestKeys func(tenant, env string) string
	now         func() time.Time

	mu    sync.Mutex
	locks map[string]*keyLock
	// noAPIServer logs once that the API server's address is unknown.
	noAPIServer sync.Once
	// policyApplied is when the admission policies were last checked (guarded by
	// mu): at most once a resync period.
	policyApplied time.Time
	// claimedAt is when this control plane last said its configuration
	// revision runs (guarded by mu; see checkConfigRevision).
	claimedAt time.Time
	// runAt is when Run started (guarded by mu); zero without Run (an
	// operator's command, a test driving ReconcileAll).
	runAt time.Time
	// ctl is Run's informer caches and queue while it runs (guarded by
	// mu); nil otherwise, and every object is then applied.
	ctl *controllerState

	// orphanAge (a minute) is how old an unrevoked identity token that is
	// neither in the Secret nor retiring must be before it is revoked as
	// an orphan (minted by a control plane that died before it wrote the
	// Secret); younger ones may be another replica's rotation in flight.
	// afterStep, when set (tests, through
	// export_test.go), runs after each step of a reconcile ("namespace",
	// "rbac", "identity-issued", "secret", "pvc", "network", "deployment");
	// an error from it ends the reconcile as a crash would.
	orphanAge time.Duration
	afterStep func(ctx context.Context, tenant, env, step string) error
}

// keyLock serializes the work on one tenant-env in this process; cancel
// stops a provision in flight when a deprovision comes.
type keyLock struct {
	mu     sync.Mutex
	cancel context.CancelFunc
}

// New returns a provisioner over the cluster kube and the database store.
// masters are the control plane's master keys (the first signs): the
// provisioner verifies identity tokens with them and derives each worker's
// request keys. cfg is validated here.
func New(cfg Config, kube kubernetes.Interface, store Store, issuer Issuer, masters []token.MasterKey) (*K8sWorkerProvisioner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(masters) == 0 {
		return nil, errors.New("provision: no master key")
	}
	id, err := store.InstallationID(context.Background())
	if err != nil {
		return nil, err
	}
	cfg.installationID = id
	var idKeys []token.Key
	for _, m := range masters {
		idKeys = append(idKeys, m.Derive(token.PurposeIdentity, "", ""))
	}
	return &K8sWorkerProvisioner{
		cfg: cfg, kube: kube, store: store, issuer: issuer,
		idKeys: idKeys,
		requestKeys: func(tenant, env string) string {
			var ks []string
			for _, m := range masters {
				ks = append(ks, token.FormatKey(m.Derive(token.PurposeWorkerRequest, tenant, env)))
			}
			return strings.Join(ks, ",")
		},
		now:       time.Now,
		locks:     map[string]*keyLock{},
		orphanAge: time.Minute,
	}, nil
}

func (p *K8sWorkerProvisioner) keyLock(tenant, env string) *keyLock {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := tenant + "/" + env
	l := p.locks[k]
	if l == nil {
		l = &keyLock{}
		p.locks[k] = l
	}
	return l
}

// Provision records that the tenant-env's worker should exist and
// reconciles its objects. It returns once every object exists (the
// Deployment need not be available yet) with the status the cluster then
// shows. Errors are *Error: NamespaceConflict (the namespace exists and is
// not this tenant-env's: never adopted), NamespaceTerminating or
// PVCTerminating (a previous deprovision is still being finished after
// Config.TerminatingWait; the resync retries), Superseded (a deprovision
// came meanwhile), APIError.
func (p *K8sWorkerProvisioner) Provision(ctx context.Context, tenant, env string) (Status, error) {
	if err := checkNames(tenant, env); err != nil {
		return Status{}, err
	}
	if p.cfg.Image == "" {
		return Status{}, &Error{Reason: ReasonInvalid, Message: "set TALKIDE_WORKER_IMAGE: the worker image is required to provision"}
	}
	gen, err := p.store.SetWorkerDesired(ctx, tenant, env, controlstore.WorkerPresent, p.now())
	if err != nil {
		return Status{}, err
	}
	_, err = p.reconcile(ctx, tenant, env, gen, reconcileOptions{wait: p.cfg.TerminatingWait, applyAll: true})
	p.enqueue(tenant, env)
	var pe *Error
	if errors.As(err, &pe) && pe.Reason == ReasonNamespaceConflict {
		// Nothing of this tenant-env can exist there: keep no record
		// that the resync would retry forever.
		if g, serr := p.store.SetWorkerDesired(ctx, tenant, env, controlstore.WorkerAbsent, p.now()); serr == nil {
			p.store.DeleteWorkerRecord(ctx, tenant, env, g)
		}
	}
	st, serr := p.Status(ctx, tenant, env)
	if err != nil {
		return st, err
	}
	return st, serr
}

// RotateIdentity replaces the tenant-env's identity token now, as the
// resync does when it nears expiry: the new token is written to the
// Secret, the old one stays valid for Config.Grace, then is revoked.
func (p *K8sWorkerProvisioner) RotateIdentity(ctx context.Context, tenant, env string) (Status, error) {
	if err := checkNames(tenant, env); err != nil {
		return Status{}, err
	}
	rec, err := p.store.WorkerRecord(ctx, tenant, env)
	if errors.Is(err, controlstore.ErrNotFound) || (err == nil && rec.Desired != controlstore.WorkerPresent) {
		return Status{}, &Error{Reason: ReasonNotProvisioned, Message: fmt.Sprintf("%s/%s is not provisioned", tenant, env)}
	}
	if err != nil {
		return Status{}, err
	}
	_, err = p.reconcile(ctx, tenant, env, rec.Generation, reconcileOptions{forceRotate: true, wait: p.cfg.TerminatingWait, applyAll: true})
	p.enqueue(tenant, env) // the retired token's end of grace
	if err != nil {
		st, _ := p.Status(ctx, tenant, env)
		return st, err
	}
	return p.Status(ctx, tenant, env)
}

// reconcileOptions say how a reconcile goes.
type reconcileOptions struct {
	// forceRotate replaces the identity token even when it is far from
	// expiry.
	forceRotate bool
	// wait bounds the wait for a namespace or claim still being deleted
	// (0 in the controller, so one stuck worker does not hold up the
	// others).
	wait time.Duration
	// applyAll applies every object even when the controller's cache
	// shows it as wanted (an operator's provision: the cache may not have
	// seen a deletion yet).
	applyAll bool
}

// reconcile applies every object of generation gen. It returns when the
// tenant-env's identity tokens next need the provisioner (retireTokens;
// zero when unknown).
func (p *K8sWorkerProvisioner) reconcile(ctx context.Context, tenant, env string, gen int64, o reconcileOptions) (time.Time, error) {
	l := p.keyLock(tenant, env)
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.mu.Lock()
	l.cancel = cancel
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		l.cancel = nil
		p.mu.Unlock()
	}()
	due, err := p.apply(ctx, tenant, env, gen, o)
	if err != nil && ctx.Err() != nil {
		// Cancelled by a deprovision (or the caller): say why.
		if cur, rerr := p.current(context.WithoutCancel(ctx), tenant, env, gen); rerr == nil && !cur {
			err = &Error{Reason: ReasonSuperseded, Message: "a deprovision of " + tenant + "/" + env + " came while it was being provisioned", Err: err}
		}
	}
	msg := ""
	if err != nil {
		msg = err.Error()
		var pe *Error
		if errors.As(err, &pe) && pe.Reason == ReasonOutdatedConfig {
			// Not the worker's failure: the newer control plane reconciles it.
			return due, err
		}
		switch {
		case errors.As(err, &pe) && pe.Reason == ReasonSuperseded:
		case errors.As(err, &pe) && (pe.Reason == ReasonNamespaceTerminating || pe.Reason == ReasonPVCTerminating):
			// Waiting for the cluster, not failing: said once a pass.
			p.cfg.Logger.Info("worker reconcile waits", "tenant", tenant, "env", env, "generation", gen, "err", err)
		case ctx.Err() != nil:
			// The caller stopped it (the control plane shutting down,
			// an admin request gone): the next reconcile carries on.
			p.cfg.Logger.Info("worker reconcile stopped", "tenant", tenant, "env", env, "generation", gen, "err", err)
		default:
			p.cfg.Logger.Warn("worker reconcile failed", "tenant", tenant, "env", env, "generation", gen, "err", err)
		}
	}
	if serr := p.store.SetWorkerError(context.WithoutCancel(ctx), tenant, env, gen, msg); serr != nil && !errors.Is(serr, controlstore.ErrNotFound) {
		p.cfg.Logger.Warn("record worker reconcile outcome", "tenant", tenant, "env", env, "err", serr)
	}
	return due, err
}

// current reports whether generation gen is still the tenant-env's
// desired "present".
func (p *K8sWorkerProvisioner) current(ctx context.Context, tenant, env string, gen int64) (bool, error) {
	rec, err := p.store.WorkerRecord(ctx, tenant, env)
	if errors.Is(err, controlstore.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return rec.Desired == controlstore.WorkerPresent && rec.Generation == gen, nil
}

func (p *K8sWorkerProvisioner) apply(ctx context.Context, tenant, env string, gen int64, o reconcileOptions) (time.Time, error) {
	ns := Namespace(tenant, env)
	wait := o.wait
	// put applies obj unless the controller's cache shows it as wanted
	// already: every field it sets has the value it sets (fields others
	// added are theirs, as server-side apply leaves them too).
	put := func(obj object) error {
		if live, ok := p.cached(obj); ok && !o.applyAll && satisfies(obj, live) {
			return nil
		}
		return p.applyObject(ctx, obj)
	}
	if err := p.checkConfigRevision(ctx); err != nil {
		return time.Time{}, err
	}
	// Before anything is made: the policy that keeps the worker's Jobs
	// unprivileged, and the one that keeps the control plane in its own
	// namespaces.
	if err := p.ensurePolicies(ctx); err != nil {
		return time.Time{}, err
	}
	stillCurrent := func() error {
		ok, err := p.current(ctx, tenant, env, gen)
		if err != nil {
			return err
		}
		if !ok {
			return &Error{Reason: ReasonSuperseded, Message: fmt.Sprintf("a later provision or deprovision of %s/%s took over", tenant, env)}
		}
		return nil
	}
	if err := p.waitNamespace(ctx, tenant, env, wait); err != nil {
		return time.Time{}, err
	}
	if err := stillCurrent(); err != nil {
		return time.Time{}, err
	}
	if err := put(namespaceObject(&p.cfg, tenant, env)); err != nil {
		return time.Time{}, err
	}
	if err := p.step(ctx, tenant, env, "namespace"); err != nil {
		return time.Time{}, err
	}
	// A deprovision may have deleted the namespace between the check and
	// the apply (another control plane): then the namespace just made is
	// the resync's to remove, and this provision stops.
	if err := stillCurrent(); err != nil {
		return time.Time{}, err
	}
	for _, obj := range []object{quotaObject(&p.cfg, tenant, env), serviceAccountObject(&p.cfg, tenant, env), roleObject(&p.cfg, tenant, env), roleBindingObject(&p.cfg, tenant, env)} {
		if err := put(obj); err != nil {
			return time.Time{}, err
		}
	}
	if err := p.step(ctx, tenant, env, "rbac"); err != nil {
		return time.Time{}, err
	}
	secretHash, due, err := p.ensureSecret(ctx, tenant, env, o.forceRotate)
	if err != nil {
		return time.Time{}, err
	}
	if err := p.step(ctx, tenant, env, "secret"); err != nil {
		return time.Time{}, err
	}
	if err := p.ensurePVC(ctx, tenant, env, wait); err != nil {
		return time.Time{}, err
	}
	if err := p.step(ctx, tenant, env, "pvc"); err != nil {
		return time.Time{}, err
	}
	apiServer, err := p.apiServerCIDRs(ctx)
	if err != nil {
		return time.Time{}, err
	}
	for _, obj := range []object{serviceObject(&p.cfg, tenant, env), networkPolicyObject(&p.cfg, tenant, env, apiServer), jobsNetworkPolicyObject(&p.cfg, tenant, env)} {
		if err := put(obj); err != nil {
			return time.Time{}, err
		}
	}
	if err := p.step(ctx, tenant, env, "network"); err != nil {
		return time.Time{}, err
	}
	if err := stillCurrent(); err != nil {
		return time.Time{}, err
	}
	if err := put(deploymentObject(&p.cfg, tenant, env, secretHash)); err != nil {
		return time.Time{}, err
	}
	if err := p.step(ctx, tenant, env, "deployment"); err != nil {
		return time.Time{}, err
	}
	p.cfg.Logger.Debug("worker objects applied", "namespace", ns, "generation", gen)
	return due, nil
}

// checkConfigRevision refuses (OutdatedConfig) when a control plane of a
// newer configuration revision runs: during a rolling update the old
// replicas would otherwise apply the old worker image (and settings) at
// each resync, and every worker Deployment would roll back and forth
// until the last old replica stopped. Each check also says this revision
// is seen (a database write at most once a heartbeat, a read otherwise:
// not a write per worker of a resync pass); Run says so each heartbeat.
func (p *K8sWorkerProvisioner) checkConfigRevision(ctx context.Context) error {
	if p.cfg.ConfigRevision <= 0 {
		return nil
	}
	now := p.now()
	p.mu.Lock()
	claim := now.Sub(p.claimedAt) >= p.cfg.revisionHeartbeat()
	// A serving control plane (Run) claims only after it has served for
	// a while: a new revision that crashes soon after it starts must not
	// take the workers from the one serving, and give them back, at each
	// restart of a crash loop.
	settling := !p.runAt.IsZero() && p.claimedAt.IsZero() && now.Sub(p.runAt) < p.cfg.revisionSettle()
	p.mu.Unlock()
	var cur int64
	var err error
	if settling {
		// Work, without claiming, unless another revision is in charge.
		var live bool
		if cur, live, err = p.store.ConfigRevision(ctx, now); err != nil {
			return err
		}
		if cur != p.cfg.ConfigRevision && live {
			return &Error{Reason: ReasonOutdatedConfig, Message: fmt.Sprintf(
				"this control plane (configuration revision %d) started less than %v ago: it takes the workers over once it has served that long", p.cfg.ConfigRevision, p.cfg.revisionSettle())}
		}
		return nil
	}
	if claim {
		cur, err = p.store.ClaimConfigRevision(ctx, p.cfg.ConfigRevision, now, p.cfg.revisionStale())
		if err == nil {
			p.mu.Lock()
			p.claimedAt = now
			p.mu.Unlock()
		}
	} else {
		cur, _, err = p.store.ConfigRevision(ctx, now)
	}
	if err != nil {
		return err
	}
	if cur > p.cfg.ConfigRevision {
		return &Error{Reason: ReasonOutdatedConfig, Message: fmt.Sprintf(
			"this control plane's configuration (revision %d) is older than that of a control plane now running (revision %d), which keeps the workers (it gives way once unseen for %v)",
			p.cfg.ConfigRevision, cur, p.cfg.revisionStale())}
	}
	return nil
}

// object is a desired object: its TypeMeta names its kind.
type object interface {
	metav1.Object
	runtime.Object
}

// patchFunc is the Patch method of a typed client, its result dropped.
type patchFunc func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) error

func patchOf[T any](f func(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (T, error)) patchFunc {
	return func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) error {
		_, err := f(ctx, name, pt, data, opts, sub...)
		return err
	}
}

// applyObject server-side applies one desired object.
func (p *K8sWorkerProvisioner) applyObject(ctx context.Context, obj object) error {
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	ns := obj.GetNamespace()
	var patch patchFunc
	switch obj.(type) {
	case *corev1.Namespace:
		patch = patchOf(p.kube.CoreV1().Namespaces().Patch)
	case *corev1.ServiceAccount:
		patch = patchOf(p.kube.CoreV1().ServiceAccounts(ns).Patch)
	case *corev1.Service:
		patch = patchOf(p.kube.CoreV1().Services(ns).Patch)
	case *corev1.ResourceQuota:
		patch = patchOf(p.kube.CoreV1().ResourceQuotas(ns).Patch)
	case *rbacv1.Role:
		patch = patchOf(p.kube.RbacV1().Roles(ns).Patch)
	case *rbacv1.RoleBinding:
		patch = patchOf(p.kube.RbacV1().RoleBindings(ns).Patch)
	case *networkingv1.NetworkPolicy:
		patch = patchOf(p.kube.NetworkingV1().NetworkPolicies(ns).Patch)
	case *admissionv1.ValidatingAdmissionPolicy:
		patch = patchOf(p.kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Patch)
	case *admissionv1.ValidatingAdmissionPolicyBinding:
		patch = patchOf(p.kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Patch)
	case *appsv1.Deployment:
		patch = patchOf(p.kube.AppsV1().Deployments(ns).Patch)
	default:
		return fmt.Errorf("provision: cannot apply %T", obj)
	}
	if err := patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: FieldManager, Force: ptr.To(true)}); err != nil {
		return apiError("apply "+obj.GetObjectKind().GroupVersionKind().Kind+" "+obj.GetName(), err)
	}
	return nil
}

// apiError wraps a Kubernetes API error as an *Error; a namespace being
// terminated becomes NamespaceTerminating.
func apiError(what string, err error) error {
	if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		return &Error{Reason: ReasonNamespaceTerminating, Message: what + ": the namespace is being deleted", Err: err}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return &Error{Reason: ReasonAPIError, Message: what + ": " + err.Error(), Err: err}
}

// waitNamespace checks the tenant-env's namespace: absent or this
// tenant-env's is fine; one being deleted is waited for, at most
// Config.TerminatingWait; anyone else's is a conflict.
func (p *K8sWorkerProvisioner) waitNamespace(ctx context.Context, tenant, env string, wait time.Duration) error {
	name := Namespace(tenant, env)
	deadline := p.now().Add(wait)
	for {
		ns, err := p.kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return apiError("read namespace "+name, err)
		}
		if !p.cfg.ownedBy(ns.Labels, tenant, env) {
			return &Error{Reason: ReasonNamespaceConflict, Message: fmt.Sprintf("namespace %s exists and was not made by this control plane for %s/%s (labels %s=%q %s=%q %s=%q); it is left alone",
				name, tenant, env, LabelManagedBy, ns.Labels[LabelManagedBy], LabelTenant, ns.Labels[LabelTenant], LabelEnv, ns.Labels[LabelEnv])}
		}
		if ns.DeletionTimestamp == nil {
			return nil
		}
		if !p.now().Before(deadline) {
			return &Error{Reason: ReasonNamespaceTerminating, Message: terminatingMessage(ns, p.now()) + "; provisioning is retried each resync"}
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// terminatingMessage says how long ns has been terminating and what holds
// it: finalizers on the namespace itself (which the namespace controller
// does not report: whoever set them must remove them), then what the
// namespace controller's conditions say of its content.
func terminatingMessage(ns *corev1.Namespace, now time.Time) string {
	msg := fmt.Sprintf("namespace %s has been terminating for %s", ns.Name, now.Sub(ns.DeletionTimestamp.Time).Round(time.Second))
	if len(ns.Finalizers) > 0 {
		msg += fmt.Sprintf("; the namespace itself has finalizers %v (metadata.finalizers): it stays until whatever set them removes them", ns.Finalizers)
	}
	said := false
	for _, c := range ns.Status.Conditions {
		if c.Status == corev1.ConditionTrue && c.Message != "" {
			msg += "; " + c.Message
			said = true
		}
	}
	if !said && len(ns.Finalizers) == 0 && len(ns.Spec.Finalizers) > 0 {
		msg += fmt.Sprintf("; the namespace controller has yet to finish (spec.finalizers %v)", ns.Spec.Finalizers)
	}
	return msg
}

// ensurePVC creates the session volume's claim if it does not exist. A
// claim still being deleted (a previous deprovision's) is waited for at
// most Config.TerminatingWait: a new worker must not start on the old
// volume while it goes, nor fail later because it went.
func (p *K8sWorkerProvisioner) ensurePVC(ctx context.Context, tenant, env string, wait time.Duration) error {
	ns := Namespace(tenant, env)
	deadline := p.now().Add(wait)
	for {
		pvc, err := p.kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, PVCName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = p.kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvcObject(&p.cfg, tenant, env), metav1.CreateOptions{FieldManager: FieldManager})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return apiError("create PersistentVolumeClaim "+PVCName, err)
			}
			return nil
		}
		if err != nil {
			return apiError("read PersistentVolumeClaim "+PVCName, err)
		}
		if pvc.DeletionTimestamp == nil {
			return nil
		}
		if !p.now().Before(deadline) {
			return &Error{Reason: ReasonPVCTerminating, Message: fmt.Sprintf("PersistentVolumeClaim %s/%s is being deleted (for %s; finalizers %v): a new worker must not start on a volume that is going away; "+
				"kubernetes.io/pvc-protection holds it while a pod (the old worker's) uses it: deprovision, or delete that Deployment, for it to go; provisioning is retried each resync",
				ns, PVCName, p.now().Sub(pvc.DeletionTimestamp.Time).Round(time.Second), pvc.Finalizers)}
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// apiServerCIDRs are the API server's addresses for the NetworkPolicy:
// configured, else from EndpointSlice default/kubernetes (which the API
// server keeps).
func (p *K8sWorkerProvisioner) apiServerCIDRs(ctx context.Context) ([]string, error) {
	if len(p.cfg.APIServerCIDRs) > 0 {
		return p.cfg.APIServerCIDRs, nil
	}
	es, err := p.kube.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		p.noAPIServer.Do(func() {
			p.cfg.Logger.Warn("EndpointSlice default/kubernetes not found: the workers' NetworkPolicy lets them reach no API server (set TALKIDE_WORKER_APISERVER_CIDRS)")
		})
		return nil, nil
	}
	if err != nil {
		return nil, apiError("read EndpointSlice default/kubernetes", err)
	}
	var out []string
	for _, e := range es.Endpoints {
		for _, a := range e.Addresses {
			if strings.Contains(a, ":") {
				out = append(out, a+"/128")
			} else {
				out = append(out, a+"/32")
			}
		}
	}
	return out, nil
}

// ensurePolicies makes sure both cluster-wide admission policies are in
// force, at most once per Config.Resync: JobPolicy (workers' Jobs stay
// unprivileged) and ScopePolicy (the control plane's own writes stay in
// the namespaces it made). It applies them where it may (an
// administrator's credentials), else checks that an administrator
// installed each policy with a binding that denies; without either, no
// worker is provisioned (PolicyMissing): the control plane's ClusterRole
// reaches every namespace, and only ScopePolicy narrows it.
func (p *K8sWorkerProvisioner) ensurePolicies(ctx context.Context) error {
	p.mu.Lock()
	fresh := !p.policyApplied.IsZero() && p.now().Sub(p.policyApplied) < p.cfg.Resync
	p.mu.Unlock()
	if fresh {
		return nil
	}
	for _, pp := range []struct {
		name, what string
		objs       func() (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding)
	}{
		{JobPolicyName, "keeps workers' Jobs unprivileged", JobPolicy},
		{ScopePolicyName, "confines the control plane's writes to the namespaces it made", ScopePolicy},
	} {
		if err := p.ensurePolicy(ctx, pp.name, pp.what, pp.objs); err != nil {
			return err
		}
	}
	p.mu.Lock()
	p.policyApplied = p.now()
	p.mu.Unlock()
	return nil
}

// ensurePolicy applies one policy and its binding or, when the control
// plane may not (Forbidden), checks that they are installed and that the
// binding denies (an audit-only binding confines nothing).
func (p *K8sWorkerProvisioner) ensurePolicy(ctx context.Context, name, what string, objs func() (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding)) error {
	pol, bind := objs()
	err := p.applyObject(ctx, pol)
	if err == nil {
		err = p.applyObject(ctx, bind)
	}
	if err == nil || !apierrors.IsForbidden(errors.Unwrap(err)) {
		return err
	}
	// The control plane's own ClusterRole may only read them.
	missing := func(why string, err error) error {
		return &Error{Reason: ReasonPolicyMissing, Message: "the ValidatingAdmissionPolicy " + name + " (which " + what + ") " + why +
			": no worker is provisioned without it; install the manifests `talkide-controlplane clusterrole` prints (docs/provisioning.md)", Err: err}
	}
	adm := p.kube.AdmissionregistrationV1()
	if _, err := adm.ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return missing("is not installed", err)
	} else if err != nil {
		return apiError("read ValidatingAdmissionPolicy "+name, err)
	}
	b, err := adm.ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return missing("has no binding", err)
	} else if err != nil {
		return apiError("read ValidatingAdmissionPolicyBinding "+name, err)
	}
	if b.Spec.PolicyName != name || !slices.Contains(b.Spec.ValidationActions, admissionv1.Deny) {
		return missing(fmt.Sprintf("is not enforced: its binding names policy %q with actions %v, not Deny", b.Spec.PolicyName, b.Spec.ValidationActions), nil)
	}
	return nil
}

// verifyIdentity verifies an identity token of tenant/env (any tenant-env
// when tenant is "").
func (p *K8sWorkerProvisioner) verifyIdentity(tok, tenant, env string) (*token.Claims, error) {
	v := token.NewVerifier(token.PurposeIdentity, p.idKeys...)
	if tenant != "" {
		v = v.ForSubject(tenant, env)
	}
	return v.Verify(tok)
}

func (p *K8sWorkerProvisioner) step(ctx context.Context, tenant, env, name string) error {
	if p.afterStep == nil {
		return nil
	}
	return p.afterStep(ctx, tenant, env, name)
}

func hash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:8])
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
