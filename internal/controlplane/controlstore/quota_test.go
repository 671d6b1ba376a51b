package controlstore

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestConversationQuota guards against case C6's missing quotas: one user
// could create conversations without end (about 100k exhausted the agent
// uids of the whole tenant-env). Concurrent creations never pass a cap, a
// deleted conversation stops counting and is no longer found.
func TestConversationQuota(t *testing.T) {
	for store, open := range openers {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			db := open(t)
			ctx := t.Context()
			for _, u := range []string{"alice", "bob", "carol"} {
				if err := db.UpsertUser(ctx, User{ID: u, TokenHash: "h-" + u}, [2]string{"demo", "dev"}); err != nil {
					t.Fatal(err)
				}
			}
			caps := ConversationCaps{PerUser: 2, PerTenantEnv: 3}
			conv := func(id, user string) Conversation {
				return Conversation{ID: id, Tenant: "demo", Env: "dev", UserID: user, CreatedAt: time.UnixMilli(1).UTC()}
			}
			// 16 at once for alice: exactly 2 pass.
			var wg sync.WaitGroup
			var mu sync.Mutex
			ok, refused := 0, 0
			for i := range 16 {
				wg.Go(func() {
					err := db.CreateConversationCapped(ctx, conv(fmt.Sprintf("a%d", i), "alice"), caps)
					mu.Lock()
					defer mu.Unlock()
					var qe *QuotaError
					switch {
					case err == nil:
						ok++
					case errors.As(err, &qe) && qe.Scope == "user" && qe.Max == 2:
						refused++
					default:
						t.Errorf("create: %v", err)
					}
				})
			}
			wg.Wait()
			if ok != 2 || refused != 14 {
				t.Fatalf("16 concurrent creations by one user with a cap of 2: %d created, %d refused", ok, refused)
			}
			if err := db.CreateConversationCapped(ctx, conv("b1", "bob"), caps); err != nil {
				t.Fatal(err)
			}
			var qe *QuotaError
			if err := db.CreateConversationCapped(ctx, conv("c1", "carol"), caps); !errors.As(err, &qe) || qe.Scope != "tenant-env" || qe.Count != 3 {
				t.Fatalf("a fourth in the tenant-env: got %v, want a tenant-env QuotaError", err)
			}
			// Another tenant-env has its own count.
			other := conv("c2", "carol")
			other.Env = "prod"
			if err := db.CreateConversationCapped(ctx, other, caps); err != nil {
				t.Errorf("another tenant-env: %v", err)
			}
			if err := db.DeleteConversation(ctx, "b1", time.Now()); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Conversation(ctx, "b1"); !errors.Is(err, ErrNotFound) {
				t.Errorf("a deleted conversation: got %v, want ErrNotFound", err)
			}
			if err := db.DeleteConversation(ctx, "b1", time.Now()); !errors.Is(err, ErrNotFound) {
				t.Errorf("deleting twice: got %v, want ErrNotFound", err)
			}
			if err := db.CreateConversationCapped(ctx, conv("c1", "carol"), caps); err != nil {
				t.Errorf("after a delete: %v", err)
			}
			if err := db.CreateConversationCapped(ctx, conv("c1", "carol"), ConversationCaps{}); err == nil || IsQuota(err) {
				t.Errorf("a duplicate id: got %v, want a database error", err)
			}
		})
	}
}
