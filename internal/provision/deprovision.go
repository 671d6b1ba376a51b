package provision

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"

	"github.com/talkide/talkide/internal/controlstore"
)

// Deprovision records that the tenant-env's worker should not exist, stops
// a provision of it in flight in this process, revokes its identity tokens
// and deletes its namespace (with everything in it: the worker, its
// Secret, its session volume's claim and any build Jobs). It waits at most
// Config.TerminatingWait for the namespace to go; a namespace still
// terminating then is reported (phase Deprovisioning, with what holds it)
// and the resync finishes the work. A namespace this control plane did not
// make is never deleted (NamespaceConflict).
func (p *K8sWorkerProvisioner) Deprovision(ctx context.Context, tenant, env string) (Status, error) {
	if err := checkNames(tenant, env); err != nil {
		return Status{}, err
	}
	gen, err := p.store.SetWorkerDesired(ctx, tenant, env, controlstore.WorkerAbsent, p.now())
	if err != nil {
		return Status{}, err
	}
	l := p.keyLock(tenant, env)
	p.mu.Lock()
	if l.cancel != nil {
		l.cancel()
	}
	p.mu.Unlock()
	err = p.finishDeprovision(ctx, tenant, env, gen, p.cfg.TerminatingWait)
	st, serr := p.Status(ctx, tenant, env)
	if err != nil {
		return st, err
	}
	return st, serr
}

// finishDeprovision revokes the tenant-env's tokens, deletes its namespace
// and, once the namespace is gone (waiting at most wait), the record of
// generation gen.
func (p *K8sWorkerProvisioner) finishDeprovision(ctx context.Context, tenant, env string, gen int64, wait time.Duration) error {
	l := p.keyLock(tenant, env)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := p.revokeAll(ctx, tenant, env); err != nil {
		return err
	}
	gone, err := p.deleteNamespace(ctx, tenant, env, wait)
	var pe *Error
	if errors.As(err, &pe) && pe.Reason == ReasonNamespaceConflict {
		// Nothing of ours is there: the deprovision is complete, and the
		// operator hears whose namespace it is.
		if derr := p.store.DeleteWorkerRecord(ctx, tenant, env, gen); derr != nil && !errors.Is(derr, controlstore.ErrNotFound) {
			return derr
		}
		return err
	}
	if err != nil || !gone {
		return err
	}
	if err := p.store.DeleteWorkerRecord(ctx, tenant, env, gen); err != nil && !errors.Is(err, controlstore.ErrNotFound) {
		return err
	}
	p.cfg.Logger.Info("worker deprovisioned", "tenant", tenant, "env", env, "generation", gen)
	return nil
}

// deleteNamespace deletes the tenant-env's namespace if it is ours and
// reports whether it is gone, waiting at most wait.
func (p *K8sWorkerProvisioner) deleteNamespace(ctx context.Context, tenant, env string, wait time.Duration) (bool, error) {
	name := Namespace(tenant, env)
	nss := p.kube.CoreV1().Namespaces()
	deadline := p.now().Add(wait)
	for {
		ns, err := nss.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, apiError("read namespace "+name, err)
		}
		if !p.cfg.ownedBy(ns.Labels, tenant, env) {
			return false, &Error{Reason: ReasonNamespaceConflict, Message: fmt.Sprintf("namespace %s was not made by this control plane for %s/%s: not deleted", name, tenant, env)}
		}
		if ns.DeletionTimestamp == nil {
			// Preconditioned on its uid: never a namespace made anew
			// since it was read.
			err := nss.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &ns.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return false, apiError("delete namespace "+name, err)
			}
			p.cfg.Logger.Info("namespace deleted", "namespace", name)
			continue
		}
		if !p.now().Before(deadline) {
			return false, nil
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return false, err
		}
	}
}

// Run reconciles every worker each Config.Resync until ctx ends: it makes
// missing objects again, rotates identity tokens near expiry and revokes
// retired ones, finishes deprovisions, and deletes namespaces it made that
// no record wants (left by a control plane that died mid-way). With a
// Config.ConfigRevision it also claims that revision every few seconds:
// start it once the control plane serves, so that a new revision that
// cannot even start never takes the workers from the one serving.
func (p *K8sWorkerProvisioner) Run(ctx context.Context) {
	if _, err := p.kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, ScopePolicyName, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		p.cfg.Logger.Error("the ValidatingAdmissionPolicy " + ScopePolicyName + " is not installed: the control plane's ServiceAccount is not confined to the namespaces it makes (install `talkide-controlplane clusterrole`; docs/provisioning.md)")
	}
	if p.cfg.ConfigRevision > 0 {
		p.mu.Lock()
		if p.runAt.IsZero() {
			p.runAt = p.now()
		}
		p.mu.Unlock()
		go p.heartbeat(ctx)
	}
	t := time.NewTicker(p.cfg.Resync)
	defer t.Stop()
	for {
		if err := p.ReconcileAll(ctx); err != nil && ctx.Err() == nil {
			p.cfg.Logger.Warn("worker resync", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// heartbeat says, each Config.revisionHeartbeat until ctx ends, that this
// control plane's configuration revision runs (checkConfigRevision), so
// that a resync pass longer than the staleness window does not hand the
// workers back to an older revision.
func (p *K8sWorkerProvisioner) heartbeat(ctx context.Context) {
	t := time.NewTicker(p.cfg.revisionHeartbeat())
	defer t.Stop()
	for {
		if err := p.checkConfigRevision(ctx); err != nil && ctx.Err() == nil {
			p.cfg.Logger.Debug("configuration revision", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Start runs Run in a goroutine, counting the control plane as serving
// from now (the settling of its configuration revision starts before the
// first request can reach it).
func (p *K8sWorkerProvisioner) Start(ctx context.Context) {
	p.mu.Lock()
	p.runAt = p.now()
	p.mu.Unlock()
	go p.Run(ctx)
}

// ReconcileAll is one resync pass (see Run). It goes on past a failing
// worker and returns the failures joined.
func (p *K8sWorkerProvisioner) ReconcileAll(ctx context.Context) error {
	if err := p.checkConfigRevision(ctx); err != nil {
		p.cfg.Logger.Debug("worker resync skipped", "err", err)
		return nil
	}
	recs, err := p.store.WorkerRecords(ctx)
	if err != nil {
		return err
	}
	var errs []error
	wanted := map[string]bool{}
	for _, r := range recs {
		if r.Desired == controlstore.WorkerPresent {
			wanted[Namespace(r.Tenant, r.Env)+"\x00"+r.Tenant+"\x00"+r.Env] = true
			if err := p.reconcile(ctx, r.Tenant, r.Env, r.Generation, false, 0); err != nil {
				var pe *Error
				if !errors.As(err, &pe) || pe.Reason != ReasonSuperseded {
					errs = append(errs, fmt.Errorf("%s/%s: %w", r.Tenant, r.Env, err))
				}
			}
			continue
		}
		if err := p.finishDeprovision(ctx, r.Tenant, r.Env, r.Generation, 0); err != nil {
			errs = append(errs, fmt.Errorf("deprovision %s/%s: %w", r.Tenant, r.Env, err))
		}
	}
	// Namespaces this control plane made that no record wants.
	list, err := p.kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: k8slabels.SelectorFromSet(map[string]string{
		LabelManagedBy: ManagedBy, LabelInstallation: p.cfg.Installation, LabelInstallationID: p.cfg.installationID}).String()})
	if err != nil {
		return errors.Join(append(errs, apiError("list namespaces", err))...)
	}
	for _, ns := range list.Items {
		t, e := ns.Labels[LabelTenant], ns.Labels[LabelEnv]
		if ns.DeletionTimestamp != nil || !ValidName(t) || !ValidName(e) || ns.Name != Namespace(t, e) || wanted[ns.Name+"\x00"+t+"\x00"+e] {
			continue
		}
		l := p.keyLock(t, e)
		l.mu.Lock()
		// Check again under the lock: a provision may have begun since
		// the records were read.
		rec, err := p.store.WorkerRecord(ctx, t, e)
		switch {
		case err == nil && rec.Desired == controlstore.WorkerPresent:
		case err != nil && !errors.Is(err, controlstore.ErrNotFound):
			errs = append(errs, err)
		default:
			p.cfg.Logger.Warn("deleting a worker namespace no provision wants (orphan)", "namespace", ns.Name)
			err = p.revokeAll(ctx, t, e)
			if err == nil {
				_, err = p.deleteNamespace(ctx, t, e, 0)
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
		l.mu.Unlock()
	}
	return errors.Join(errs...)
}
