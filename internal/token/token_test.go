package token

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func testMaster(t *testing.T, id string) MasterKey {
	t.Helper()
	m, err := NewMasterKey(id)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func fixedClock(t time.Time) func() time.Time { return func() time.Time { return t } }

func TestRoundTripEachPurpose(t *testing.T) {
	m := testMaster(t, "k1")
	for _, p := range []Purpose{PurposeIdentity, PurposeGateway, PurposeWorkerRequest} {
		k := m.Derive(p, "acme", "dev")
		tok, err := NewSigner(p, k).Sign(Claims{Tenant: "acme", Env: "dev", Conversation: "c1", User: "u1"}, time.Minute)
		if err != nil {
			t.Fatalf("%s: sign: %v", p, err)
		}
		c, err := NewVerifier(p, k).ForSubject("acme", "dev").Verify(tok)
		if err != nil {
			t.Fatalf("%s: verify: %v", p, err)
		}
		if c.Tenant != "acme" || c.Env != "dev" || c.Conversation != "c1" || c.User != "u1" || c.Purpose != p {
			t.Errorf("%s: got claims %+v", p, c)
		}
		if c.ID == "" || c.ExpiresAt == nil || c.NotBefore == nil || c.IssuedAt == nil {
			t.Errorf("%s: registered claims missing: %+v", p, c.RegisteredClaims)
		}
	}
}

// TestAttacks lists the tokens an attacker could present and the error each
// must be refused with.
func TestAttacks(t *testing.T) {
	m := testMaster(t, "k1")
	other := testMaster(t, "k1") // same kid, different secret
	now := time.Unix(1_800_000_000, 0)

	gwKey := m.Derive(PurposeGateway, "", "")
	gateway := NewVerifier(PurposeGateway, gwKey)
	gateway.now = fixedClock(now)

	sign := func(p Purpose, k Key, c Claims, ttl time.Duration, at time.Time) string {
		t.Helper()
		s := NewSigner(p, k)
		s.now = fixedClock(at)
		tok, err := s.Sign(c, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	base := Claims{Tenant: "acme", Env: "dev", Conversation: "c1", User: "u1"}
	valid := sign(PurposeGateway, gwKey, base, WorkerTokenTTL, now)
	if _, err := gateway.Verify(valid); err != nil {
		t.Fatalf("valid token refused: %v", err)
	}

	// A worker holds its request-token key: it must not be able to sign a
	// WorkerToken, an identity token, or another tenant's request token.
	workerKey := m.Derive(PurposeWorkerRequest, "acme", "dev")

	forgedSig := valid[:strings.LastIndex(valid, ".")+1] + base64.RawURLEncoding.EncodeToString(make([]byte, 32))
	parts := strings.Split(valid, ".")
	tamperedPayload := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"pur":"gateway","ten":"other","env":"dev"}`)) + "." + parts[2]

	noneTok, err := jwt.NewWithClaims(jwt.SigningMethodNone, base).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	hs512 := jwt.NewWithClaims(jwt.SigningMethodHS512, base)
	hs512.Header["kid"] = "k1"
	hs512Tok, _ := hs512.SignedString(gwKey.Secret)

	cases := []struct {
		name string
		tok  string
		v    *Verifier
		want error
	}{
		{"forged signature", forgedSig, gateway, ErrSignature},
		{"tampered payload", tamperedPayload, gateway, ErrSignature},
		{"signed with another master key of the same kid", sign(PurposeGateway, other.Derive(PurposeGateway, "", ""), base, time.Minute, now), gateway, ErrSignature},
		{"unknown kid", sign(PurposeGateway, Key{ID: "k9", Secret: gwKey.Secret}, base, time.Minute, now), gateway, ErrUnknownKey},
		{"worker request key signs a WorkerToken", sign(PurposeGateway, workerKey, base, time.Minute, now), gateway, ErrSignature},
		{"identity token presented to the gateway", sign(PurposeIdentity, m.Derive(PurposeIdentity, "", ""), base, time.Hour, now), gateway, ErrSignature},
		{"gateway key but identity purpose", sign(PurposeIdentity, gwKey, base, time.Hour, now), gateway, ErrPurpose},
		{"expired", sign(PurposeGateway, gwKey, base, WorkerTokenTTL, now.Add(-WorkerTokenTTL-DefaultClockSkew)), gateway, ErrExpired},
		{"not yet valid", sign(PurposeGateway, gwKey, Claims{Tenant: "acme", Env: "dev", RegisteredClaims: jwt.RegisteredClaims{NotBefore: jwt.NewNumericDate(now.Add(time.Minute))}}, 2*time.Minute, now), gateway, ErrNotYetValid},
		{"alg none", noneTok, gateway, ErrSignature},
		{"alg HS512", hs512Tok, gateway, ErrSignature},
		{"empty", "", gateway, ErrMalformed},
		{"garbage", "a.b.c", gateway, ErrMalformed},
		{"oversized", strings.Repeat("a", maxTokenLen+1), gateway, ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.v.Verify(tc.tok)
			if !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestRequestTokenTenantIsolation(t *testing.T) {
	m := testMaster(t, "k1")
	now := time.Unix(1_800_000_000, 0)
	acmeKey := m.Derive(PurposeWorkerRequest, "acme", "dev")
	globexKey := m.Derive(PurposeWorkerRequest, "globex", "dev")
	acmeProdKey := m.Derive(PurposeWorkerRequest, "acme", "prod")
	for _, k := range []Key{globexKey, acmeProdKey} {
		if string(k.Secret) == string(acmeKey.Secret) {
			t.Fatal("derived request keys of two tenant-envs are equal")
		}
	}
	acmeWorker := NewVerifier(PurposeWorkerRequest, acmeKey).ForSubject("acme", "dev")
	acmeWorker.now = fixedClock(now)

	sign := func(k Key, tenant, env string) string {
		s := NewSigner(PurposeWorkerRequest, k)
		s.now = fixedClock(now)
		tok, err := s.Sign(RequestClaims(tenant, env, "POST", "/v1/x", nil), RequestTokenTTL)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	cases := []struct {
		name string
		tok  string
		want error
	}{
		{"globex worker key signs for acme", sign(globexKey, "acme", "dev"), ErrSignature},
		{"globex token sent to acme", sign(globexKey, "globex", "dev"), ErrSignature},
		{"acme prod token sent to acme dev", sign(acmeProdKey, "acme", "prod"), ErrSignature},
		{"acme key, audience of globex", func() string {
			// A holder of acme's key can mint tokens naming globex, but the
			// acme worker refuses them (subject) and globex cannot verify them.
			return sign(acmeKey, "globex", "dev")
		}(), ErrSubject},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := acmeWorker.Verify(tc.tok); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
	globexWorker := NewVerifier(PurposeWorkerRequest, globexKey).ForSubject("globex", "dev")
	globexWorker.now = fixedClock(now)
	if _, err := globexWorker.Verify(sign(acmeKey, "globex", "dev")); !errors.Is(err, ErrSignature) {
		t.Errorf("acme's key signing for globex: got %v, want %v", err, ErrSignature)
	}
}

func TestRequestBindingAndReplay(t *testing.T) {
	m := testMaster(t, "k1")
	k := m.Derive(PurposeWorkerRequest, "acme", "dev")
	body := []byte(`{"text":"hi"}`)
	tok, err := NewSigner(PurposeWorkerRequest, k).Sign(RequestClaims("acme", "dev", "POST", "/v1/conversations/c1/messages", body), RequestTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewVerifier(PurposeWorkerRequest, k).ForSubject("acme", "dev").Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckRequest(c, "POST", "/v1/conversations/c1/messages", body); err != nil {
		t.Errorf("matching request refused: %v", err)
	}
	for name, args := range map[string][3]string{
		"other method": {"DELETE", "/v1/conversations/c1/messages", string(body)},
		"other path":   {"POST", "/v1/conversations/c2/messages", string(body)},
		"other body":   {"POST", "/v1/conversations/c1/messages", `{"text":"rm -rf"}`},
	} {
		if err := CheckRequest(c, args[0], args[1], []byte(args[2])); !errors.Is(err, ErrRequestMismatch) {
			t.Errorf("%s: got %v, want %v", name, err, ErrRequestMismatch)
		}
	}
	rc := NewReplayCache()
	if err := rc.Check(c); err != nil {
		t.Fatalf("first use: %v", err)
	}
	if err := rc.Check(c); !errors.Is(err, ErrReplayed) {
		t.Errorf("second use: got %v, want %v", err, ErrReplayed)
	}
}

func TestReplayCacheForgetsExpired(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	rc := NewReplayCache()
	rc.now = fixedClock(now)
	c := &Claims{RegisteredClaims: jwt.RegisteredClaims{ID: "a", ExpiresAt: jwt.NewNumericDate(now.Add(time.Second))}}
	if err := rc.Check(c); err != nil {
		t.Fatal(err)
	}
	rc.now = fixedClock(now.Add(time.Minute))
	if err := rc.Check(&Claims{RegisteredClaims: jwt.RegisteredClaims{ID: "b", ExpiresAt: jwt.NewNumericDate(now.Add(2 * time.Minute))}}); err != nil {
		t.Fatal(err)
	}
	if _, ok := rc.seen["a"]; ok {
		t.Error("expired id still held after a sweep")
	}
}

func TestParseMasterKey(t *testing.T) {
	m := testMaster(t, "2026a")
	got, err := ParseMasterKey(m.String())
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != m.ID || string(got.Secret) != string(m.Secret) {
		t.Errorf("round trip: got %q, want %q", got.ID, m.ID)
	}
	for _, bad := range []string{"", "k1", ":abc", "k1:!!!", "k1:" + base64.RawURLEncoding.EncodeToString([]byte("short")), "a.b:" + m.String()[6:]} {
		if _, err := ParseMasterKey(bad); err == nil {
			t.Errorf("ParseMasterKey(%q): got nil error", bad)
		}
	}
	keys, err := ParseKeys(FormatKey(Key(m)) + "," + FormatKey(Key(testMaster(t, "k2"))))
	if err != nil || len(keys) != 2 {
		t.Errorf("ParseKeys: got %d keys, err %v; want 2, nil", len(keys), err)
	}
	if _, err := ParseKeys(FormatKey(Key(testMaster(t, "k1"))) + "," + FormatKey(Key(testMaster(t, "k1")))); err == nil {
		t.Error("ParseKeys accepted two keys with one id (rotation would pick either)")
	}
}

func FuzzVerify(f *testing.F) {
	k := Key{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")}
	tok, _ := NewSigner(PurposeGateway, k).Sign(Claims{Tenant: "a", Env: "b"}, time.Minute)
	f.Add(tok)
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Add("...")
	v := NewVerifier(PurposeGateway, k)
	f.Fuzz(func(t *testing.T, s string) {
		c, err := v.Verify(s)
		if err == nil && (c == nil || c.Purpose != PurposeGateway) {
			t.Fatalf("accepted %q with claims %+v", s, c)
		}
	})
}

func FuzzParseKeys(f *testing.F) {
	f.Add("k1:" + base64.RawURLEncoding.EncodeToString(make([]byte, 32)))
	f.Add("a:b,c:d")
	f.Fuzz(func(t *testing.T, s string) {
		keys, err := ParseKeys(s)
		if err != nil {
			return
		}
		for _, k := range keys {
			if k.ID == "" || len(k.Secret) < minSecretLen {
				t.Fatalf("accepted a weak key %q from %q", k.ID, s)
			}
		}
	})
}
