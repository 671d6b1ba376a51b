package lease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// KubeManager keeps leases as coordination.k8s.io/v1 Lease objects in one
// namespace (the tenant-env namespace). Acquisitions and renewals are
// updates with the object's resourceVersion, so the API server lets exactly
// one of two racing replicas win. LeaseTransitions is the generation.
type KubeManager struct {
	client    kubernetes.Interface
	namespace string
	cfg       Config
	now       func() time.Time
}

var _ Manager = (*KubeManager)(nil)

// Annotations on the Lease objects.
const (
	annotationName        = "talkide.dev/lease-name"
	annotationAddress     = "talkide.dev/address"
	annotationIncarnation = "talkide.dev/incarnation"
	annotationReleased    = "talkide.dev/released"
)

// NewKubeManager keeps leases in namespace through client. The worker's
// ServiceAccount needs get, create and update on leases in that namespace.
func NewKubeManager(client kubernetes.Interface, namespace string, cfg Config) (*KubeManager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &KubeManager{client: client, namespace: namespace, cfg: cfg, now: time.Now}, nil
}

// Duration implements Manager.
func (m *KubeManager) Duration() time.Duration { return m.cfg.Duration }

// objectName maps a lease name (a conversation id, which may hold
// characters Kubernetes names do not allow) to a valid object name.
func objectName(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "talkide-conv-" + hex.EncodeToString(sum[:12])
}

func (m *KubeManager) toRecord(l *coordinationv1.Lease) Record {
	r := Record{Address: l.Annotations[annotationAddress], Incarnation: l.Annotations[annotationIncarnation]}
	if l.Spec.HolderIdentity != nil {
		r.Holder = *l.Spec.HolderIdentity
	}
	if l.Spec.LeaseTransitions != nil {
		r.Generation = int64(*l.Spec.LeaseTransitions)
	}
	if l.Spec.RenewTime != nil {
		r.RenewedAt = l.Spec.RenewTime.Time
		if l.Spec.LeaseDurationSeconds != nil {
			r.ExpiresAt = r.RenewedAt.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
		}
	}
	r.Released = l.Annotations[annotationReleased] == "true"
	return r
}

// fill writes this identity's holding of generation gen into l.
func (m *KubeManager) fill(l *coordinationv1.Lease, name string, gen int64, acquired bool) {
	now := metav1.NewMicroTime(m.now())
	holder := m.cfg.Identity.Holder
	secs := int32((m.cfg.Duration + time.Second - 1) / time.Second)
	transitions := int32(gen)
	l.Spec.HolderIdentity = &holder
	l.Spec.LeaseDurationSeconds = &secs
	l.Spec.RenewTime = &now
	l.Spec.LeaseTransitions = &transitions
	if acquired {
		l.Spec.AcquireTime = &now
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[annotationName] = name
	l.Annotations[annotationAddress] = m.cfg.Identity.Address
	l.Annotations[annotationIncarnation] = m.cfg.Identity.Incarnation
	delete(l.Annotations, annotationReleased)
}

// Acquire implements Manager.
func (m *KubeManager) Acquire(ctx context.Context, name string) (Record, error) {
	leases := m.client.CoordinationV1().Leases(m.namespace)
	l, err := leases.Get(ctx, objectName(name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: objectName(name), Namespace: m.namespace}}
		m.fill(l, name, 1, true)
		created, err := leases.Create(ctx, l, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return Record{}, m.heldNow(ctx, name)
		}
		if err != nil {
			return Record{}, fmt.Errorf("acquire lease %s: %w", name, err)
		}
		return m.toRecord(created), nil
	}
	if err != nil {
		return Record{}, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	cur := m.toRecord(l)
	if cur.HeldBy(m.cfg.Identity) {
		return m.Renew(ctx, name, cur.Generation)
	}
	if cur.Holder != "" && !cur.freeFor(m.cfg.Identity, m.now(), m.cfg.Skew) {
		return Record{}, &HeldError{Record: cur}
	}
	m.fill(l, name, cur.Generation+1, true)
	updated, err := leases.Update(ctx, l, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return Record{}, m.heldNow(ctx, name)
	}
	if err != nil {
		return Record{}, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	return m.toRecord(updated), nil
}

// heldNow reports the record that won a race.
func (m *KubeManager) heldNow(ctx context.Context, name string) error {
	cur, err := m.Get(ctx, name)
	if err != nil {
		return err
	}
	return &HeldError{Record: cur}
}

// Renew implements Manager.
func (m *KubeManager) Renew(ctx context.Context, name string, gen int64) (Record, error) {
	leases := m.client.CoordinationV1().Leases(m.namespace)
	l, err := leases.Get(ctx, objectName(name), metav1.GetOptions{})
	if err != nil {
		return Record{}, fmt.Errorf("renew lease %s: %w", name, err)
	}
	cur := m.toRecord(l)
	if cur.Generation != gen || !cur.HeldBy(m.cfg.Identity) {
		return Record{}, fmt.Errorf("renew lease %s generation %d: %w", name, gen, ErrLost)
	}
	m.fill(l, name, gen, false)
	updated, err := leases.Update(ctx, l, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return Record{}, fmt.Errorf("renew lease %s generation %d: %w (concurrent update)", name, gen, ErrLost)
	}
	if err != nil {
		return Record{}, fmt.Errorf("renew lease %s: %w", name, err)
	}
	return m.toRecord(updated), nil
}

// Release implements Manager.
func (m *KubeManager) Release(ctx context.Context, name string, gen int64) error {
	leases := m.client.CoordinationV1().Leases(m.namespace)
	l, err := leases.Get(ctx, objectName(name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release lease %s: %w", name, err)
	}
	cur := m.toRecord(l)
	if cur.Generation != gen || !cur.HeldBy(m.cfg.Identity) {
		return nil
	}
	l.Annotations[annotationReleased] = "true"
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("release lease %s: %w", name, err)
	}
	return nil
}

// Get implements Manager.
func (m *KubeManager) Get(ctx context.Context, name string) (Record, error) {
	l, err := m.client.CoordinationV1().Leases(m.namespace).Get(ctx, objectName(name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Record{}, nil
	}
	if err != nil {
		return Record{}, fmt.Errorf("read lease %s: %w", name, err)
	}
	return m.toRecord(l), nil
}
