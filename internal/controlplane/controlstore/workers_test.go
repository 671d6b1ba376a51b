package controlstore

import (
	"errors"
	"testing"
	"time"
)

// testWorkerRecords: every change of the desired state raises the
// generation; outcomes and deletion apply only to their generation.
func testWorkerRecords(t *testing.T, db *DB) {
	ctx := t.Context()
	at := time.UnixMilli(1000).UTC()
	if _, err := db.WorkerRecord(ctx, "acme", "dev"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("no record: %v", err)
	}
	if _, err := db.SetWorkerDesired(ctx, "acme", "dev", "running", at); err == nil {
		t.Fatal("accepted a desired state that is neither present nor absent")
	}
	g1, err := db.SetWorkerDesired(ctx, "acme", "dev", WorkerPresent, at)
	if err != nil || g1 != 1 {
		t.Fatalf("first: %d %v", g1, err)
	}
	if err := db.SetWorkerError(ctx, "acme", "dev", g1, "boom"); err != nil {
		t.Fatal(err)
	}
	g2, err := db.SetWorkerDesired(ctx, "acme", "dev", WorkerAbsent, at)
	if err != nil || g2 != 2 {
		t.Fatalf("second: %d %v", g2, err)
	}
	rec, err := db.WorkerRecord(ctx, "acme", "dev")
	if err != nil || rec.Desired != WorkerAbsent || rec.Generation != 2 || rec.LastError != "" || !rec.UpdatedAt.Equal(at) {
		t.Fatalf("record %+v %v", rec, err)
	}
	if err := db.SetWorkerError(ctx, "acme", "dev", g1, "late"); !errors.Is(err, ErrNotFound) {
		t.Errorf("an outcome of an overtaken generation was stored: %v", err)
	}
	if err := db.DeleteWorkerRecord(ctx, "acme", "dev", g1); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted by an overtaken generation: %v", err)
	}
	if _, err := db.SetWorkerDesired(ctx, "acme", "prod", WorkerPresent, at); err != nil {
		t.Fatal(err)
	}
	if recs, err := db.WorkerRecords(ctx); err != nil || len(recs) != 2 || recs[0].Env != "dev" || recs[1].Env != "prod" {
		t.Fatalf("records %+v %v", recs, err)
	}
	if err := db.DeleteWorkerRecord(ctx, "acme", "dev", g2); err != nil {
		t.Fatal(err)
	}
	if err := db.SetWorkerIdentity(ctx, "acme", "prod", "j1"); err != nil {
		t.Fatal(err)
	}
	if rec, _ := db.WorkerRecord(ctx, "acme", "prod"); rec.IdentityJTI != "j1" {
		t.Errorf("identity jti %q", rec.IdentityJTI)
	}
	if err := db.SetWorkerIdentity(ctx, "acme", "nope", "j1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("identity of no record: %v", err)
	}
	id1, err := db.InstallationID(ctx)
	if err != nil || len(id1) != 16 {
		t.Fatalf("installation id %q %v", id1, err)
	}
	if id2, _ := db.InstallationID(ctx); id2 != id1 {
		t.Errorf("installation id changed: %q then %q", id1, id2)
	}
	// The newest configuration revision seen stays in charge; one no
	// longer seen gives way.
	if got, live, err := db.ConfigRevision(ctx, time.Now()); err != nil || got != 0 || live {
		t.Errorf("ConfigRevision before any claim = %d, %v, %v; want 0, not live", got, live, err)
	}
	t0 := time.UnixMilli(1_000_000)
	for _, c := range []struct {
		rev   int64
		after time.Duration
		stale time.Duration
		want  int64
	}{{3, 0, time.Minute, 3}, {2, time.Second, time.Minute, 3}, {3, 2 * time.Second, time.Minute, 3},
		{12, 3 * time.Second, time.Minute, 12}, {9, 4 * time.Second, time.Minute, 12},
		{9, 3*time.Second + time.Minute, time.Minute, 12}, {9, 3*time.Second + time.Minute + time.Millisecond, time.Minute, 9},
		{12, time.Hour, 30 * time.Minute, 12},
		// The window is the holder's, not the claimer's.
		{9, time.Hour + time.Minute, time.Second, 12}, {9, time.Hour + 30*time.Minute + time.Millisecond, time.Second, 9}} {
		if got, err := db.ClaimConfigRevision(ctx, c.rev, t0.Add(c.after), c.stale); err != nil || got != c.want {
			t.Errorf("ClaimConfigRevision(%d at +%v) = %d, %v; want %d", c.rev, c.after, got, err, c.want)
		}
	}
	// The last claim (revision 9 at +1h30m, window 1s) is live for a second.
	if rev, live, _ := db.ConfigRevision(ctx, t0.Add(time.Hour+30*time.Minute+time.Second)); rev != 9 || !live {
		t.Errorf("ConfigRevision within the window: %d live %v", rev, live)
	}
	if rev, live, _ := db.ConfigRevision(ctx, t0.Add(time.Hour+30*time.Minute+time.Second+2*time.Millisecond)); rev != 9 || live {
		t.Errorf("ConfigRevision past the window: %d live %v", rev, live)
	}
	g3, _ := db.SetWorkerDesired(ctx, "acme", "prod", WorkerPresent, at)
	if err := db.DeleteWorkerRecord(ctx, "acme", "prod", g3); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted a record that wants its worker present: %v", err)
	}
}

// testIdentityRetiring: a retiring token keeps the earlier end of grace;
// revoked tokens are not live.
func testIdentityRetiring(t *testing.T, db *DB) {
	ctx := t.Context()
	for i, jti := range []string{"a", "b", "c"} {
		it := IdentityToken{JTI: jti, Tenant: "acme", Env: "dev", IssuedAt: time.UnixMilli(int64(i + 1)).UTC(), ExpiresAt: time.UnixMilli(1e9).UTC()}
		if err := db.RecordIdentityToken(ctx, it); err != nil {
			t.Fatal(err)
		}
	}
	db.RecordIdentityToken(ctx, IdentityToken{JTI: "x", Tenant: "other", Env: "dev", IssuedAt: time.UnixMilli(1), ExpiresAt: time.UnixMilli(2)})
	if err := db.RetireIdentityToken(ctx, "a", time.UnixMilli(500)); err != nil {
		t.Fatal(err)
	}
	if err := db.RetireIdentityToken(ctx, "a", time.UnixMilli(900)); err != nil {
		t.Fatal(err)
	}
	if err := db.RevokeIdentityToken(ctx, "b", time.UnixMilli(10)); err != nil {
		t.Fatal(err)
	}
	if err := db.RetireIdentityToken(ctx, "b", time.UnixMilli(900)); !errors.Is(err, ErrNotFound) {
		t.Errorf("retired a revoked token: %v", err)
	}
	live, err := db.LiveIdentityTokens(ctx, "acme", "dev")
	if err != nil || len(live) != 2 || live[0].JTI != "a" || live[1].JTI != "c" {
		t.Fatalf("live %+v %v", live, err)
	}
	if live[0].RetireAt == nil || !live[0].RetireAt.Equal(time.UnixMilli(500).UTC()) || live[1].RetireAt != nil {
		t.Fatalf("retire times %v %v", live[0].RetireAt, live[1].RetireAt)
	}
}
