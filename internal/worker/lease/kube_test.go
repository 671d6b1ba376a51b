package lease

import (
	"context"
	"slices"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"

	"github.com/talkide/talkide/internal/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// leaseVerbs are the rights on leases the worker's Role grants in its
// namespace (NewKubeManager's doc).
var leaseVerbs = []string{"get", "create", "update", "delete"}

var leaseRules = []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: leaseVerbs}}

// leaseClient makes a namespace on the test cluster and a client for a
// ServiceAccount there whose Role grants exactly rules.
func leaseClient(t *testing.T, rules []rbacv1.PolicyRule) (kubernetes.Interface, string) {
	t.Helper()
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	cs, err := kubernetes.NewForConfig(c.ServiceAccountConfig(t, ns, "talkide-worker", rules))
	if err != nil {
		t.Fatal(err)
	}
	return cs, ns
}

// TestKubeLeaseRights: each right the worker's Role grants on leases is
// one the backend uses; without it taking or handing over a lease is
// Forbidden, and without delete a deleted conversation's lease stays. (With all of them, the conformance cases pass as that
// ServiceAccount.)
func TestKubeLeaseRights(t *testing.T) {
	ctx := context.Background()
	a, b := ids()
	for _, missing := range []string{"get", "create", "update", "delete"} {
		t.Run("without "+missing, func(t *testing.T) {
			verbs := slices.DeleteFunc(slices.Clone(leaseVerbs), func(v string) bool { return v == missing })
			cs, ns := leaseClient(t, []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: verbs}})
			mk := func(id Identity) *KubeManager {
				m, err := NewKubeManager(cs, ns, Config{Identity: id, Duration: 10 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				return m
			}
			ma, mb := mk(a), mk(b)
			// The steps a worker takes: take its replica lease, renew it,
			// take a conversation, release it, another replica takes it.
			err := func() error {
				if _, err := ma.Heartbeat(ctx, 0); err != nil {
					return err
				}
				if _, err := ma.Heartbeat(ctx, 1); err != nil {
					return err
				}
				if _, err := mb.Heartbeat(ctx, 0); err != nil {
					return err
				}
				r, err := ma.Acquire(ctx, "conv")
				if err != nil {
					return err
				}
				if err := ma.Release(ctx, "conv", r.Generation); err != nil {
					return err
				}
				if _, err = mb.Acquire(ctx, "conv"); err != nil {
					return err
				}
				// The conversation is deleted: its lease goes.
				return mb.Forget(ctx, "conv")
			}()
			if !apierrors.IsForbidden(err) {
				t.Errorf("got %v, want Forbidden", err)
			}
		})
	}
}
