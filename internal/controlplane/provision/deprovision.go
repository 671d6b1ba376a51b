package provision

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
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
	p.enqueue(tenant, env) // to finish it once the namespace is gone
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

// ReconcileAll is one resync pass, done at once in the caller (an
// operator's command, a test): every tenant-env with a record, and every
// namespace of this installation, reconciled as Run's queue would (see
// Run). It goes on past a failing one and returns the failures joined.
func (p *K8sWorkerProvisioner) ReconcileAll(ctx context.Context) error {
	if err := p.checkConfigRevision(ctx); err != nil {
		p.cfg.Logger.Debug("worker resync skipped", "err", err)
		return nil
	}
	keys, err := p.allKeys(ctx)
	if keys == nil && err != nil {
		return err
	}
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for _, k := range keys {
		if _, err := p.reconcileKey(ctx, k.tenant, k.env); err != nil {
			errs = append(errs, fmt.Errorf("%s/%s: %w", k.tenant, k.env, err))
		}
	}
	return errors.Join(errs...)
}
