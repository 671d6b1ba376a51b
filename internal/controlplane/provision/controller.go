package provision

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
)

// The controller: client-go's shared informers on the objects the
// provisioner makes (selected by this installation's labels) and a
// rate-limited work queue of tenant-envs. Any change to one of them queues
// its tenant-env; a worker of the queue reconciles it level-based (from
// the database record and the cluster as they are now), applying only the
// objects that differ from what is wanted, and queues it again when its
// next identity-token deadline comes. The periodic resync queues every
// tenant-env as a backstop. client-go's informers and workqueue rather
// than controller-runtime: the desired state lives in the control plane's
// database, not in a custom resource, so a manager built around a
// Kubernetes kind and its scheme would add a large dependency and hide the
// two things this loop must get right (the key lock shared with the admin
// API's synchronous calls, and the configuration-revision hand-over).

// key is a tenant-env in the work queue.
type key struct{ tenant, env string }

// reconcileWorkers is how many tenant-envs are reconciled at once.
const reconcileWorkers = 4

// watched are the kinds the controller watches. Secrets are not: the
// control plane may read only its own Secret by name (ClusterRole), and
// listing them would mean reading every Secret in the cluster; a deleted
// Secret is made again at the resync, while the pods keep the mounted
// token for its grace.
var watched = []struct {
	kind     string
	informer func(informers.SharedInformerFactory) cache.SharedIndexInformer
	obj      reflect.Type
}{
	{"Namespace", func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Core().V1().Namespaces().Informer()
	}, reflect.TypeFor[*corev1.Namespace]()},
	{"ServiceAccount", func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Core().V1().ServiceAccounts().Informer()
	}, reflect.TypeFor[*corev1.ServiceAccount]()},
	{"Service", func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Core().V1().Services().Informer()
	}, reflect.TypeFor[*corev1.Service]()},
	{"ResourceQuota", func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Core().V1().ResourceQuotas().Informer()
	}, reflect.TypeFor[*corev1.ResourceQuota]()},
	{"PersistentVolumeClaim", func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Core().V1().PersistentVolumeClaims().Informer()
	}, reflect.TypeFor[*corev1.PersistentVolumeClaim]()},
	{"Role", func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Rbac().V1().Roles().Informer()
	}, reflect.TypeFor[*rbacv1.Role]()},
	{"RoleBinding", func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Rbac().V1().RoleBindings().Informer()
	}, reflect.TypeFor[*rbacv1.RoleBinding]()},
	{"NetworkPolicy", func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Networking().V1().NetworkPolicies().Informer()
	}, reflect.TypeFor[*networkingv1.NetworkPolicy]()},
	{"Deployment", func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Apps().V1().Deployments().Informer()
	}, reflect.TypeFor[*appsv1.Deployment]()},
}

// controllerState is what Run sets up for the reconciles: the informers'
// caches (by object type; only kinds whose cache has synced) and the
// queue.
type controllerState struct {
	caches map[reflect.Type]cache.Indexer
	queue  workqueue.TypedRateLimitingInterface[key]
}

// cached returns the live object the informers hold for obj's kind,
// namespace and name; ok is false when that kind is not cached (no Run,
// or its cache never synced) or the object is not in it.
func (p *K8sWorkerProvisioner) cached(obj object) (runtime.Object, bool) {
	p.mu.Lock()
	st := p.ctl
	p.mu.Unlock()
	if st == nil {
		return nil, false
	}
	idx := st.caches[reflect.TypeOf(obj)]
	if idx == nil {
		return nil, false
	}
	k := obj.GetName()
	if obj.GetNamespace() != "" {
		k = obj.GetNamespace() + "/" + k
	}
	live, ok, err := idx.GetByKey(k)
	if err != nil || !ok {
		return nil, false
	}
	ro, ok := live.(runtime.Object)
	return ro, ok
}

// HasSynced reports whether Run runs with the caches of every kind it
// watches filled: from then on a change to a worker's objects is seen as
// it happens. (Run goes on without the kinds it could not list within a
// minute; HasSynced then stays false.)
func (p *K8sWorkerProvisioner) HasSynced() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ctl != nil && len(p.ctl.caches) == len(watched)
}

// statusOnly reports whether an update changed only what the cluster
// reports of an object (a Deployment's readiness, a quota's usage, a
// claim's binding, a namespace's conditions), none of which a reconcile
// writes or reads: such updates, the most frequent by far, queue nothing.
func statusOnly(old, cur any) bool {
	o, ok1 := old.(metav1.Object)
	c, ok2 := cur.(metav1.Object)
	if !ok1 || !ok2 || !maps.Equal(o.GetLabels(), c.GetLabels()) || !maps.Equal(o.GetAnnotations(), c.GetAnnotations()) ||
		!slices.Equal(o.GetFinalizers(), c.GetFinalizers()) || !o.GetDeletionTimestamp().Equal(c.GetDeletionTimestamp()) {
		return false
	}
	switch o := old.(type) {
	case *appsv1.Deployment:
		return equality.Semantic.DeepEqual(o.Spec, cur.(*appsv1.Deployment).Spec)
	case *corev1.ResourceQuota:
		return equality.Semantic.DeepEqual(o.Spec, cur.(*corev1.ResourceQuota).Spec)
	case *corev1.PersistentVolumeClaim:
		return equality.Semantic.DeepEqual(o.Spec, cur.(*corev1.PersistentVolumeClaim).Spec)
	case *corev1.Namespace:
		return equality.Semantic.DeepEqual(o.Spec, cur.(*corev1.Namespace).Spec)
	}
	return false
}

// enqueue queues tenant/env for Run's controller, when it runs: after an
// admin call changed it, so that the controller knows its new deadlines
// (a rotated token's end of grace) without waiting for the resync.
func (p *K8sWorkerProvisioner) enqueue(tenant, env string) {
	p.mu.Lock()
	st := p.ctl
	p.mu.Unlock()
	if st != nil {
		st.queue.Add(key{tenant, env})
	}
}

// selector selects this installation's objects.
func (p *K8sWorkerProvisioner) selector() string {
	return k8slabels.SelectorFromSet(map[string]string{
		LabelManagedBy: ManagedBy, LabelInstallation: p.cfg.Installation, LabelInstallationID: p.cfg.installationID}).String()
}

// Run is the provisioner's controller. It watches the objects of this
// installation's workers and reconciles a tenant-env within moments of a
// change to one of them (a deleted Service, a Deployment scaled behind its
// back, a namespace that finished terminating), rotates identity tokens
// and revokes retired ones when they come due, finishes deprovisions, and
// deletes namespaces it made that no record wants (left by a control plane
// that died mid-way). Every Config.Resync it also queues every tenant-env,
// as a backstop for what it does not watch (the Secret) and for missed
// events. With a Config.ConfigRevision it claims that revision every few
// seconds: run it once the control plane serves, so that a new revision
// that cannot even start never takes the workers from the one serving.
//
// Run blocks until ctx ends and every reconcile in flight, the informers
// and the heartbeat have stopped; it returns nil then. A kind whose cache
// cannot be filled within a minute (a ClusterRole of an older release
// without list and watch on it) is logged at ERROR and left to the resync.
func (p *K8sWorkerProvisioner) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.runAt.IsZero() {
		p.runAt = p.now()
	}
	p.mu.Unlock()
	if err := p.ensurePolicies(ctx); err != nil && ctx.Err() == nil {
		p.cfg.Logger.Error("no worker can be provisioned", "err", err)
	}
	q := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedMaxOfRateLimiter(
			// Retries (AddRateLimited) only: per tenant-env 250 ms after
			// a failure, doubling to two minutes, and at most 20 a second
			// together. Changes and due times are queued at once.
			workqueue.NewTypedItemExponentialFailureRateLimiter[key](250*time.Millisecond, 2*time.Minute),
			&workqueue.TypedBucketRateLimiter[key]{Limiter: rate.NewLimiter(20, 100)},
		),
		workqueue.TypedRateLimitingQueueConfig[key]{Name: "talkide-provisioner"})
	factory := informers.NewSharedInformerFactoryWithOptions(p.kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = p.selector() }))
	enqueue := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		m, ok := obj.(metav1.Object)
		if !ok {
			return
		}
		t, e := m.GetLabels()[LabelTenant], m.GetLabels()[LabelEnv]
		if ValidName(t) && ValidName(e) {
			q.Add(key{t, e})
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		UpdateFunc: func(old, obj any) {
			if !statusOnly(old, obj) {
				enqueue(obj)
			}
		},
		DeleteFunc: enqueue,
	}
	infs := map[string]cache.SharedIndexInformer{}
	for _, w := range watched {
		inf := w.informer(factory)
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
		infs[w.kind] = inf
	}
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	defer func() {
		q.ShutDown()
		wg.Wait()
		factory.Shutdown()
	}()
	// Caches first: a reconcile that skips an apply because the cache
	// says the object is as wanted must see a full cache.
	syncCtx, stop := context.WithTimeout(ctx, time.Minute)
	caches := map[reflect.Type]cache.Indexer{}
	var unsynced []string
	for _, w := range watched {
		inf := infs[w.kind]
		if cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
			caches[w.obj] = inf.GetIndexer()
		} else {
			unsynced = append(unsynced, w.kind)
		}
	}
	stop()
	if ctx.Err() != nil {
		return nil
	}
	if len(unsynced) > 0 {
		p.cfg.Logger.Error("the provisioner cannot watch some of its objects: their drift is repaired only at the resync; install the ClusterRole this release's `talkide-controlplane clusterrole` prints (it grants list and watch on them)",
			"kinds", unsynced, "resync", p.cfg.Resync)
	}
	p.mu.Lock()
	p.ctl = &controllerState{caches: caches, queue: q}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.ctl = nil
		p.mu.Unlock()
	}()
	if p.cfg.ConfigRevision > 0 {
		wg.Go(func() { p.heartbeat(ctx) })
	}
	for range reconcileWorkers {
		wg.Go(func() {
			for p.processNext(ctx, q) {
			}
		})
	}
	t := time.NewTicker(p.cfg.Resync)
	defer t.Stop()
	for {
		if err := p.enqueueAll(ctx, q); err != nil && ctx.Err() == nil {
			p.cfg.Logger.Warn("worker resync", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// allKeys are every tenant-env with a record and every one with a
// namespace of this installation (an orphan's record may be missing),
// each once, records first. With the records read, a failure to list the
// namespaces is returned with the keys of the records.
func (p *K8sWorkerProvisioner) allKeys(ctx context.Context) ([]key, error) {
	recs, err := p.store.WorkerRecords(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[key]bool{}
	var keys []key
	add := func(k key) {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	for _, r := range recs {
		add(key{r.Tenant, r.Env})
	}
	nss, err := p.managedNamespaces(ctx)
	for _, ns := range nss {
		add(key{ns.Labels[LabelTenant], ns.Labels[LabelEnv]})
	}
	return keys, err
}

// enqueueAll queues allKeys.
func (p *K8sWorkerProvisioner) enqueueAll(ctx context.Context, q workqueue.TypedRateLimitingInterface[key]) error {
	keys, err := p.allKeys(ctx)
	for _, k := range keys {
		q.Add(k)
	}
	return err
}

// processNext reconciles one tenant-env from q; false once q shut down.
func (p *K8sWorkerProvisioner) processNext(ctx context.Context, q workqueue.TypedRateLimitingInterface[key]) bool {
	k, shutdown := q.Get()
	if shutdown {
		return false
	}
	defer q.Done(k)
	after, err := p.reconcileKey(ctx, k.tenant, k.env)
	switch {
	case ctx.Err() != nil:
	case err != nil && after > 0:
		// Waiting for the cluster (a namespace being deleted): at that
		// pace, not later each time.
		q.Forget(k)
		q.AddAfter(k, after)
	case err != nil:
		// Logged by reconcile; tried again later, later each time.
		q.AddRateLimited(k)
	default:
		q.Forget(k)
		if after > 0 && after < p.cfg.Resync {
			q.AddAfter(k, after)
		}
	}
	return true
}

// reconcileKey brings one tenant-env to its record, whatever happened
// before: present is reconciled, absent is removed, a namespace of this
// installation that no record wants is removed as an orphan. It returns
// how soon it must be looked at again (an identity token coming due, a
// namespace still terminating; 0: at the resync, or with the queue's
// backoff after an error) and what failed. A
// reconcile that a later provision or deprovision overtook, or that a
// newer configuration revision is in charge of, is no failure.
func (p *K8sWorkerProvisioner) reconcileKey(ctx context.Context, tenant, env string) (time.Duration, error) {
	if err := p.checkConfigRevision(ctx); err != nil {
		p.cfg.Logger.Debug("worker reconcile skipped", "tenant", tenant, "env", env, "err", err)
		return 0, nil
	}
	rec, err := p.store.WorkerRecord(ctx, tenant, env)
	switch {
	case errors.Is(err, controlstore.ErrNotFound):
		return 0, p.removeOrphan(ctx, tenant, env)
	case err != nil:
		return 0, err
	case rec.Desired == controlstore.WorkerPresent:
		due, err := p.reconcile(ctx, tenant, env, rec.Generation, reconcileOptions{})
		var pe *Error
		if errors.As(err, &pe) && (pe.Reason == ReasonSuperseded || pe.Reason == ReasonOutdatedConfig) {
			return 0, nil
		}
		if errors.As(err, &pe) && (pe.Reason == ReasonNamespaceTerminating || pe.Reason == ReasonPVCTerminating) {
			// Waiting, not failing: the namespace's (or claim's)
			// deletion event queues it too; this is in case that event
			// is missed.
			return 5 * time.Second, err
		}
		if err != nil {
			return 0, err
		}
		if due.IsZero() {
			return 0, nil
		}
		// A little after, so that the deadline has passed when it runs.
		return max(due.Sub(p.now()), 0) + 100*time.Millisecond, nil
	default:
		if err := p.finishDeprovision(ctx, tenant, env, rec.Generation, 0); err != nil {
			return 0, fmt.Errorf("deprovision %s/%s: %w", tenant, env, err)
		}
		if _, err := p.store.WorkerRecord(ctx, tenant, env); err == nil {
			return 5 * time.Second, nil // the namespace is still terminating
		}
		return 0, nil
	}
}

// managedNamespaces lists this installation's namespaces.
func (p *K8sWorkerProvisioner) managedNamespaces(ctx context.Context) ([]corev1.Namespace, error) {
	list, err := p.kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: p.selector()})
	if err != nil {
		return nil, apiError("list namespaces", err)
	}
	out := list.Items[:0]
	for _, ns := range list.Items {
		t, e := ns.Labels[LabelTenant], ns.Labels[LabelEnv]
		if ValidName(t) && ValidName(e) && ns.Name == Namespace(t, e) {
			out = append(out, ns)
		}
	}
	return out, nil
}

// removeOrphan deletes the tenant-env's namespace when it is this
// installation's and no record wants it (checked under the tenant-env's
// lock: a provision may have begun since).
func (p *K8sWorkerProvisioner) removeOrphan(ctx context.Context, tenant, env string) error {
	l := p.keyLock(tenant, env)
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := p.store.WorkerRecord(ctx, tenant, env)
	if !errors.Is(err, controlstore.ErrNotFound) {
		return err
	}
	ns, err := p.kube.CoreV1().Namespaces().Get(ctx, Namespace(tenant, env), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return apiError("read namespace "+Namespace(tenant, env), err)
	}
	if ns.DeletionTimestamp != nil || !p.cfg.ownedBy(ns.Labels, tenant, env) {
		return nil // going already, or not ours
	}
	p.cfg.Logger.Warn("deleting a worker namespace no provision wants (orphan)", "namespace", ns.Name)
	if err := p.revokeAll(ctx, tenant, env); err != nil {
		return err
	}
	_, err = p.deleteNamespace(ctx, tenant, env, 0)
	return err
}
