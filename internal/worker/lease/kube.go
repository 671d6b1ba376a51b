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
// namespace (the tenant-env namespace): one per replica
// (talkide-replica-<hash of the holder>, renewed) and one per conversation
// (talkide-conv-<hash of the id>, written when taken and when released, with
// no leaseDurationSeconds: it lives as long as its holder's replica lease).
// Acquisitions and renewals are updates with the object's resourceVersion,
// so the API server lets exactly one of two racing processes win.
// LeaseTransitions is the generation.
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
// ServiceAccount needs get, create, update and delete (a deleted
// conversation's lease is removed) on leases in that
// namespace.
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

// replicaObjectName is the replica lease object of holder.
func replicaObjectName(holder string) string {
	sum := sha256.Sum256([]byte(holder))
	return "talkide-replica-" + hex.EncodeToString(sum[:12])
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

// fill writes this identity's holding of generation gen into l; a replica
// lease gets a duration, a conversation lease none.
func (m *KubeManager) fill(l *coordinationv1.Lease, name string, gen int64, acquired, replica bool) {
	now := metav1.NewMicroTime(m.now())
	holder := m.cfg.Identity.Holder
	transitions := int32(gen)
	l.Spec.HolderIdentity = &holder
	l.Spec.LeaseDurationSeconds = nil
	if replica {
		secs := int32((m.cfg.Duration + time.Second - 1) / time.Second)
		l.Spec.LeaseDurationSeconds = &secs
	}
	l.Spec.RenewTime = &now
	l.Spec.LeaseTransitions = &transitions
	if acquired {
		l.Spec.AcquireTime = &now
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	kind := "conversation"
	if replica {
		kind = "replica"
	}
	l.Labels[labelKind] = kind
	l.Annotations[annotationName] = name
	l.Annotations[annotationAddress] = m.cfg.Identity.Address
	l.Annotations[annotationIncarnation] = m.cfg.Identity.Incarnation
	delete(l.Annotations, annotationReleased)
}

// labelKind tells replica and conversation Lease objects apart.
const labelKind = "talkide.dev/lease-kind"

// Heartbeat implements Manager.
func (m *KubeManager) Heartbeat(ctx context.Context, gen int64) (Record, error) {
	leases := m.client.CoordinationV1().Leases(m.namespace)
	objName := replicaObjectName(m.cfg.Identity.Holder)
	l, err := leases.Get(ctx, objName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if gen != 0 {
			return Record{}, fmt.Errorf("renew replica lease generation %d: %w (deleted)", gen, ErrLost)
		}
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: objName, Namespace: m.namespace}}
		m.fill(l, m.cfg.Identity.Holder, 1, true, true)
		created, err := leases.Create(ctx, l, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return Record{}, m.replicaHeldNow(ctx)
		}
		if err != nil {
			return Record{}, fmt.Errorf("take replica lease: %w", err)
		}
		return m.toRecord(created), nil
	}
	if err != nil {
		return Record{}, fmt.Errorf("replica lease: %w", err)
	}
	cur := m.toRecord(l)
	next := gen
	if gen != 0 {
		if cur.Generation != gen || !cur.HeldBy(m.cfg.Identity) {
			return Record{}, fmt.Errorf("renew replica lease generation %d: %w (current %d held by %s/%s)", gen, ErrLost, cur.Generation, cur.Holder, cur.Incarnation)
		}
	} else {
		if !cur.replicaFreeFor(m.cfg.Identity, m.now(), m.cfg.Skew) {
			return Record{}, &HeldError{Record: cur}
		}
		next = cur.Generation + 1
	}
	m.fill(l, m.cfg.Identity.Holder, next, gen == 0, true)
	updated, err := leases.Update(ctx, l, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		if gen != 0 {
			return Record{}, fmt.Errorf("renew replica lease generation %d: %w (concurrent update)", gen, ErrLost)
		}
		return Record{}, m.replicaHeldNow(ctx)
	}
	if err != nil {
		return Record{}, fmt.Errorf("replica lease: %w", err)
	}
	return m.toRecord(updated), nil
}

func (m *KubeManager) replicaHeldNow(ctx context.Context) error {
	l, err := m.client.CoordinationV1().Leases(m.namespace).Get(ctx, replicaObjectName(m.cfg.Identity.Holder), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("replica lease: %w", err)
	}
	return &HeldError{Record: m.toRecord(l)}
}

// ReleaseReplica implements Manager.
func (m *KubeManager) ReleaseReplica(ctx context.Context, gen int64) error {
	return m.release(ctx, replicaObjectName(m.cfg.Identity.Holder), gen)
}

func (m *KubeManager) release(ctx context.Context, objName string, gen int64) error {
	leases := m.client.CoordinationV1().Leases(m.namespace)
	l, err := leases.Get(ctx, objName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release lease: %w", err)
	}
	cur := m.toRecord(l)
	if cur.Generation != gen || !cur.HeldBy(m.cfg.Identity) {
		return nil
	}
	l.Annotations[annotationReleased] = "true"
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("release lease: %w", err)
	}
	return nil
}

// live fills cur.ExpiresAt from its holder's replica lease and reports
// whether the holding is alive.
func (m *KubeManager) live(ctx context.Context, cur Record) (Record, bool, error) {
	if cur.Generation == 0 || cur.Released {
		cur.ExpiresAt = time.Time{}
		return cur, false, nil
	}
	var rep Record
	l, err := m.client.CoordinationV1().Leases(m.namespace).Get(ctx, replicaObjectName(cur.Holder), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return cur, false, err
	default:
		rep = m.toRecord(l)
	}
	alive, exp := convLive(cur, rep, m.now(), m.cfg.Skew)
	cur.ExpiresAt = exp
	return cur, alive, nil
}

// Acquire implements Manager.
func (m *KubeManager) Acquire(ctx context.Context, name string) (Record, error) {
	leases := m.client.CoordinationV1().Leases(m.namespace)
	l, err := leases.Get(ctx, objectName(name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: objectName(name), Namespace: m.namespace}}
		m.fill(l, name, 1, true, false)
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
	if cur.Holder != m.cfg.Identity.Holder {
		cur, alive, err := m.live(ctx, cur)
		if err != nil {
			return Record{}, fmt.Errorf("acquire lease %s: %w", name, err)
		}
		if alive {
			return Record{}, &HeldError{Record: cur}
		}
	}
	m.fill(l, name, cur.Generation+1, true, false)
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

// Release implements Manager.
func (m *KubeManager) Release(ctx context.Context, name string, gen int64) error {
	if err := m.release(ctx, objectName(name), gen); err != nil {
		return fmt.Errorf("%s: %w", name, err)
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
	r, _, err := m.live(ctx, m.toRecord(l))
	if err != nil {
		return Record{}, fmt.Errorf("read lease %s: %w", name, err)
	}
	return r, nil
}

// Replica implements Manager.
func (m *KubeManager) Replica(ctx context.Context, holder string) (Record, error) {
	l, err := m.client.CoordinationV1().Leases(m.namespace).Get(ctx, replicaObjectName(holder), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Record{}, nil
	}
	if err != nil {
		return Record{}, fmt.Errorf("read replica lease %s: %w", holder, err)
	}
	return m.toRecord(l), nil
}

// Forget implements Manager.
func (m *KubeManager) Forget(ctx context.Context, name string) error {
	err := m.client.CoordinationV1().Leases(m.namespace).Delete(ctx, objectName(name), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("forget lease %s: %w", name, err)
	}
	return nil
}
