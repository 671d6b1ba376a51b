package provision_test

import (
	"context"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/controlplane/provision"
)

// Rotation writes a new token to the Secret, keeps the old one valid for
// the grace period and revokes it then; a token nearing expiry is rotated
// by the resync by itself.
func TestIdentityRotationWithGrace(t *testing.T) {
	ctx := context.Background()
	t.Run("forced", func(t *testing.T) {
		r := newRig(t, func(c *provision.Config) { c.Grace = 3 * time.Second })
		tn, ns := r.provisioned()
		old := secretToken(t, r.kube, ns)
		st, err := r.p.RotateIdentity(ctx, tn, "dev")
		if err != nil {
			t.Fatal(err)
		}
		cur := secretToken(t, r.kube, ns)
		if cur == old || st.Identity == nil || len(st.Identity.Retiring) != 1 {
			t.Fatalf("after rotation: same token %v, status %+v", cur == old, st.Identity)
		}
		if !r.identityValid(old) || !r.identityValid(cur) {
			t.Fatal("both tokens must be valid during the grace period")
		}
		// Nothing revokes the old one before the grace ends ...
		if err := r.p.ReconcileAll(ctx); err != nil {
			t.Fatal(err)
		}
		if !r.identityValid(old) {
			t.Fatal("the old token was revoked before its grace ended")
		}
		// ... and the resync does after it.
		time.Sleep(time.Until(st.Identity.Retiring[0].RetireAt))
		if err := r.p.ReconcileAll(ctx); err != nil {
			t.Fatal(err)
		}
		if r.identityValid(old) {
			t.Fatal("the old token is still valid after its grace")
		}
		if !r.identityValid(cur) {
			t.Fatal("the new token is refused")
		}
		// The pods were not rolled: the token is a file the worker
		// re-reads, not part of the pod template.
		st2, _ := r.p.Status(ctx, tn, "dev")
		if st2.Identity == nil || st2.Identity.JTI != st.Identity.JTI || len(st2.Identity.Retiring) != 0 {
			t.Errorf("status after the grace: %+v", st2.Identity)
		}
	})
	t.Run("near expiry", func(t *testing.T) {
		r := newRig(t, func(c *provision.Config) {
			c.IdentityTTL, c.RotateBefore, c.Grace = time.Minute, 58*time.Second, 20*time.Second
		})
		tn := r.tenant()
		if _, err := r.p.Provision(ctx, tn, "dev"); err != nil {
			t.Fatal(err)
		}
		first := secretToken(t, r.kube, tn+"-dev")
		time.Sleep(2500 * time.Millisecond) // now within RotateBefore of expiry
		if err := r.p.ReconcileAll(ctx); err != nil {
			t.Fatal(err)
		}
		if secretToken(t, r.kube, tn+"-dev") == first {
			t.Fatal("a token within RotateBefore of its expiry was not rotated")
		}
		if !r.identityValid(first) {
			t.Fatal("the replaced token lost its grace")
		}
	})
}
