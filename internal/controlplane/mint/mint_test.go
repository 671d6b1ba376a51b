package mint_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/go-cmp/cmp"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
)

// Fixture data: the worker under test belongs to demo/dev.
const (
	tenant   = "demo"
	env      = "dev"
	userID   = "alice"
	convID   = "conv-demo-1"
	otherTen = "conv-other-tenant"
	otherEnv = "conv-other-env"
	missing  = "conv-does-not-exist"
)

type fixture struct {
	db     *controlstore.DB
	master token.MasterKey
	h      *mint.Handler
	srv    *httptest.Server
	logs   *platformtest.LogBuffer
	// identity is a valid identity token of demo/dev, issued by IssueIdentity.
	identity string
}

// newFixture opens a real SQLite control store with conversations of
// demo/dev, of another tenant and of another env, and serves the mint on
// loopback.
func newFixture(t testing.TB) *fixture {
	t.Helper()
	ctx := t.Context()
	db, err := controlstore.OpenSQLite(ctx, filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	master, err := token.NewMasterKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []controlstore.User{{ID: userID, TokenHash: "h-alice"}, {ID: "bob", TokenHash: "h-bob"}} {
		if err := db.UpsertUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	for _, c := range []controlstore.Conversation{
		{ID: convID, Tenant: tenant, Env: env, UserID: userID, CreatedAt: now},
		{ID: otherTen, Tenant: "other", Env: env, UserID: "bob", CreatedAt: now},
		{ID: otherEnv, Tenant: tenant, Env: "prod", UserID: userID, CreatedAt: now},
	} {
		if err := db.CreateConversation(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	logs := &platformtest.LogBuffer{}
	h := mint.New(db, master, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	identity, err := h.IssueIdentity(ctx, tenant, env, 0)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{db: db, master: master, h: h, srv: srv, logs: logs, identity: identity}
}

// post sends a mint request with the Authorization header authz (none when
// empty) and returns the status and body.
func (f *fixture) post(t testing.TB, authz, contentType, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, f.srv.URL+contract.PathMint, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func mintBody(conv string) string {
	b, _ := json.Marshal(contract.MintRequest{ConversationID: conv})
	return string(b)
}

// signIdentity signs an identity-purpose token with key k; when record is
// set its id is stored as issued, so that only the property under test
// (signature, expiry, …) is wrong.
func (f *fixture) signIdentity(t testing.TB, k token.Key, c token.Claims, ttl time.Duration, record bool) string {
	t.Helper()
	c.ID = token.NewID()
	tok, err := token.NewSigner(token.PurposeIdentity, k).Sign(c, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if record {
		now := time.Now()
		if err := f.db.RecordIdentityToken(t.Context(), controlstore.IdentityToken{
			JTI: c.ID, Tenant: c.Tenant, Env: c.Env, IssuedAt: now, ExpiresAt: now.Add(ttl),
		}); err != nil {
			t.Fatal(err)
		}
	}
	return tok
}

// decodeError decodes the mint's documented error shape, failing the test
// when the body is not exactly that.
func decodeError(t testing.TB, body []byte) contract.ErrorBody {
	t.Helper()
	var eb contract.ErrorBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&eb); err != nil {
		t.Fatalf("error body %q: got decode error %v, want {\"error\":{\"type\":…,\"message\":…}}", body, err)
	}
	if eb.Error.Message == "" {
		t.Errorf("error body %q: got empty message, want one", body)
	}
	return eb
}

func TestMintIssuesWorkerTokenForOwnConversation(t *testing.T) {
	f := newFixture(t)
	before := time.Now()
	status, body := f.post(t, "Bearer "+f.identity, "application/json", mintBody(convID))
	if status != http.StatusOK {
		t.Fatalf("status: got %d (%s), want 200", status, body)
	}
	var mr contract.MintResponse
	if err := json.Unmarshal(body, &mr); err != nil {
		t.Fatalf("decode %q: %v", body, err)
	}
	v := token.NewVerifier(token.PurposeGateway, f.master.Derive(token.PurposeGateway, "", ""))
	c, err := v.Verify(mr.Token)
	if err != nil {
		t.Fatalf("gateway verifier: got %v, want the minted token accepted", err)
	}
	got := struct{ Conversation, Tenant, Env, User, Subject string }{c.Conversation, c.Tenant, c.Env, c.User, c.Subject}
	want := struct{ Conversation, Tenant, Env, User, Subject string }{convID, tenant, env, userID, "demo/dev"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("claims (-want +got):\n%s", diff)
	}
	exp := c.ExpiresAt.Time
	lo, hi := before.Add(token.WorkerTokenTTL-2*time.Second), time.Now().Add(token.WorkerTokenTTL+time.Second)
	if exp.Before(lo) || exp.After(hi) {
		t.Errorf("exp: got %s, want within [%s, %s] (now + 120 s)", exp, lo, hi)
	}
	if d := mr.ExpiresAt.Sub(exp).Abs(); d > time.Second {
		t.Errorf("expires_at: got %s, token exp %s; want them within 1 s", mr.ExpiresAt, exp)
	}
	// The WorkerToken is not an identity token: it cannot mint again.
	if status, _ := f.post(t, "Bearer "+mr.Token, "application/json", mintBody(convID)); status != http.StatusUnauthorized {
		t.Errorf("minted WorkerToken presented as identity: got status %d, want 401", status)
	}
	// Two mints give two distinct tokens (fresh jti each time).
	_, body2 := f.post(t, "Bearer "+f.identity, "", mintBody(convID))
	var mr2 contract.MintResponse
	if err := json.Unmarshal(body2, &mr2); err != nil {
		t.Fatalf("decode %q: %v", body2, err)
	}
	if mr2.Token == mr.Token {
		t.Errorf("second mint: got the same token twice, want a fresh one")
	}
	if logs := f.logs.String(); strings.Contains(logs, f.identity) || strings.Contains(logs, mr.Token) {
		t.Errorf("log contains a token:\n%s", logs)
	}
}

func TestMintRefusesBadIdentity(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	idKey := f.master.Derive(token.PurposeIdentity, "", "")
	demo := token.Claims{Tenant: tenant, Env: env}

	other, err := token.NewMasterKey(f.master.ID) // same kid, other secret
	if err != nil {
		t.Fatal(err)
	}
	otherKid, err := token.NewMasterKey("k2")
	if err != nil {
		t.Fatal(err)
	}
	workerToken, err := token.NewSigner(token.PurposeGateway, f.master.Derive(token.PurposeGateway, "", "")).
		Sign(token.Claims{Tenant: tenant, Env: env, Conversation: convID, User: userID}, token.WorkerTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	// The request-token key of demo/dev is the one key a demo/dev worker holds.
	workerKey := f.master.Derive(token.PurposeWorkerRequest, tenant, env)
	requestToken, err := token.NewSigner(token.PurposeWorkerRequest, workerKey).
		Sign(token.RequestClaims(tenant, env, http.MethodPost, contract.PathMint, []byte(mintBody(convID))), token.RequestTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	// A worker forging identity claims with the key it holds.
	forgedClaims := demo
	forgedClaims.ID = token.NewID()
	forgedClaims.Purpose = token.PurposeIdentity
	forgedClaims.Issuer = token.Issuer
	forgedClaims.Subject = token.Subject(tenant, env)
	forgedClaims.Audience = jwt.ClaimStrings{token.Audience(token.PurposeIdentity, tenant, env)}
	forgedClaims.NotBefore = jwt.NewNumericDate(time.Now().Add(-time.Minute))
	forgedClaims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(time.Hour))
	forgedJWT := jwt.NewWithClaims(jwt.SigningMethodHS256, forgedClaims)
	forgedJWT.Header["kid"] = workerKey.ID
	forged, err := forgedJWT.SignedString(workerKey.Secret)
	if err != nil {
		t.Fatal(err)
	}
	noneJWT := jwt.NewWithClaims(jwt.SigningMethodNone, forgedClaims)
	noneJWT.Header["kid"] = idKey.ID
	algNone, err := noneJWT.SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.db.RecordIdentityToken(ctx, controlstore.IdentityToken{JTI: forgedClaims.ID, Tenant: tenant, Env: env, IssuedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	revoked, err := f.h.IssueIdentity(ctx, tenant, env, 0)
	if err != nil {
		t.Fatal(err)
	}
	revokedClaims, err := token.NewVerifier(token.PurposeIdentity, idKey).Verify(revoked)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.db.RevokeIdentityToken(ctx, revokedClaims.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	notYet := demo
	notYet.NotBefore = jwt.NewNumericDate(time.Now().Add(time.Hour))

	cases := []struct {
		name  string
		authz string
		tok   string // the credential that must not appear in the answer
	}{
		{name: "no authorization"},
		{name: "empty bearer", authz: "Bearer "},
		{name: "basic scheme", authz: "Basic " + base64.StdEncoding.EncodeToString([]byte("demo:"+f.identity)), tok: f.identity},
		{name: "token without scheme", authz: f.identity, tok: f.identity},
		{name: "garbage", authz: "Bearer not.a.token", tok: "not.a.token"},
		{name: "oversized", authz: "Bearer " + strings.Repeat("A", 8000)},
		{name: "other master key, same kid", tok: f.signIdentity(t, other.Derive(token.PurposeIdentity, "", ""), demo, time.Hour, true)},
		{name: "other master key, unknown kid", tok: f.signIdentity(t, otherKid.Derive(token.PurposeIdentity, "", ""), demo, time.Hour, true)},
		{name: "expired", tok: f.signIdentity(t, idKey, demo, -time.Hour, true)},
		{name: "not yet valid", tok: f.signIdentity(t, idKey, notYet, 2*time.Hour, true)},
		{name: "worker token as identity", tok: workerToken},
		{name: "request token as identity", tok: requestToken},
		{name: "identity forged with the worker's request key", tok: forged},
		{name: "alg none", tok: algNone},
		{name: "signed but never issued", tok: f.signIdentity(t, idKey, demo, time.Hour, false)},
		{name: "revoked", tok: revoked},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			authz := tc.authz
			if authz == "" && tc.tok != "" {
				authz = "Bearer " + tc.tok
			}
			status, body := f.post(t, authz, "application/json", mintBody(convID))
			if status != http.StatusUnauthorized {
				t.Fatalf("status: got %d (%s), want 401", status, body)
			}
			if eb := decodeError(t, body); eb.Error.Type != contract.ErrTypeUnauthorized {
				t.Errorf("error.type: got %q, want %q", eb.Error.Type, contract.ErrTypeUnauthorized)
			}
			if tc.tok != "" && strings.Contains(string(body), tc.tok) {
				t.Errorf("error body contains the presented token: %s", body)
			}
		})
	}
	logs := f.logs.String()
	for _, tc := range cases {
		if tc.tok != "" && strings.Contains(logs, tc.tok) {
			t.Errorf("log contains the token of case %q", tc.name)
		}
	}
}

// TestMintRevocationTakesEffectImmediately guards against a cache of
// verified identity tokens outliving a revocation.
func TestMintRevocationTakesEffectImmediately(t *testing.T) {
	f := newFixture(t)
	if status, body := f.post(t, "Bearer "+f.identity, "application/json", mintBody(convID)); status != http.StatusOK {
		t.Fatalf("before revocation: got %d (%s), want 200", status, body)
	}
	c, err := token.NewVerifier(token.PurposeIdentity, f.master.Derive(token.PurposeIdentity, "", "")).Verify(f.identity)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.db.RevokeIdentityToken(t.Context(), c.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	if status, body := f.post(t, "Bearer "+f.identity, "application/json", mintBody(convID)); status != http.StatusUnauthorized {
		t.Fatalf("after revocation: got %d (%s), want 401", status, body)
	}
}

func TestMintRefusesConversationOutsideTenantEnv(t *testing.T) {
	f := newFixture(t)
	bodies := map[string][]byte{}
	for _, conv := range []string{otherTen, otherEnv, missing} {
		t.Run(conv, func(t *testing.T) {
			status, body := f.post(t, "Bearer "+f.identity, "application/json", mintBody(conv))
			if status != http.StatusForbidden {
				t.Fatalf("status: got %d (%s), want 403", status, body)
			}
			if eb := decodeError(t, body); eb.Error.Type != contract.ErrTypeForbidden {
				t.Errorf("error.type: got %q, want %q", eb.Error.Type, contract.ErrTypeForbidden)
			}
			if strings.Contains(string(body), f.identity) {
				t.Errorf("error body contains the identity token: %s", body)
			}
			bodies[conv] = body
		})
	}
	// Existence must not leak: a missing conversation and another
	// tenant's look the same.
	if diff := cmp.Diff(string(bodies[otherTen]), string(bodies[missing])); diff != "" {
		t.Errorf("answers for another tenant's and a missing conversation differ (-other +missing):\n%s", diff)
	}
	// A token of another tenant cannot reach demo/dev's conversation either.
	otherIdentity, err := f.h.IssueIdentity(t.Context(), "other", env, 0)
	if err != nil {
		t.Fatal(err)
	}
	if status, body := f.post(t, "Bearer "+otherIdentity, "application/json", mintBody(convID)); status != http.StatusForbidden {
		t.Errorf("other tenant's identity for demo/dev conversation: got %d (%s), want 403", status, body)
	}
}

func TestMintRejectsMalformedRequest(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name, contentType, body string
		status                  int
		typ                     string
	}{
		{"not JSON", "application/json", "conversation_id=" + convID, 400, contract.ErrTypeInvalidRequest},
		{"empty body", "application/json", "", 400, contract.ErrTypeInvalidRequest},
		{"array", "application/json", `["` + convID + `"]`, 400, contract.ErrTypeInvalidRequest},
		{"unknown field", "application/json", `{"conversation_id":"` + convID + `","tenant":"other"}`, 400, contract.ErrTypeInvalidRequest},
		{"trailing data", "application/json", mintBody(convID) + `{}`, 400, contract.ErrTypeInvalidRequest},
		{"wrong type", "application/json", `{"conversation_id":42}`, 400, contract.ErrTypeInvalidRequest},
		{"missing id", "application/json", `{}`, 400, contract.ErrTypeInvalidRequest},
		{"path traversal id", "application/json", mintBody("../" + convID), 400, contract.ErrTypeInvalidRequest},
		{"id with slash", "application/json", mintBody("a/b"), 400, contract.ErrTypeInvalidRequest},
		{"id too long", "application/json", mintBody(strings.Repeat("a", 65)), 400, contract.ErrTypeInvalidRequest},
		{"leading dash", "application/json", mintBody("-x"), 400, contract.ErrTypeInvalidRequest},
		{"wrong content type", "text/plain", mintBody(convID), 415, contract.ErrTypeUnsupported},
		{"oversized body", "application/json", `{"conversation_id":"` + strings.Repeat("a", 8<<10) + `"}`, 413, contract.ErrTypeTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := f.post(t, "Bearer "+f.identity, tc.contentType, tc.body)
			if status != tc.status {
				t.Fatalf("status: got %d (%s), want %d", status, body, tc.status)
			}
			if eb := decodeError(t, body); eb.Error.Type != tc.typ {
				t.Errorf("error.type: got %q, want %q", eb.Error.Type, tc.typ)
			}
			if strings.Contains(string(body), f.identity) {
				t.Errorf("error body contains the identity token: %s", body)
			}
		})
	}
	// The identity is checked before the body is looked at: without one,
	// a malformed body is still a 401.
	if status, body := f.post(t, "", "application/json", "{"); status != http.StatusUnauthorized {
		t.Errorf("malformed body without identity: got %d (%s), want 401", status, body)
	}
}

// FuzzMintBody posts arbitrary bodies with a valid identity token: the mint
// must never answer 5xx, never panic, and answer 200 only with a token.
func FuzzMintBody(f *testing.F) {
	fx := newFixture(f)
	for _, seed := range []string{
		mintBody(convID), mintBody(otherTen), mintBody(missing), "", "{", "null", "[]", `{"conversation_id":null}`,
		`{"conversation_id":"` + convID + `","x":1}`, `{"conversation_id":"\u0000"}`, "\xff\xfe", strings.Repeat("{", 5000),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, contract.PathMint, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+fx.identity)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		fx.h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("body %q: got status %d (%s), want < 500", body, rec.Code, rec.Body)
		}
		if rec.Code == http.StatusOK {
			var mr contract.MintResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &mr); err != nil || mr.Token == "" {
				t.Fatalf("body %q: 200 without a token: %s", body, rec.Body)
			}
		}
		if strings.Contains(rec.Body.String(), fx.identity) {
			t.Fatalf("body %q: answer contains the identity token", body)
		}
	})
}

// TestMintAcceptsIdentityOfRotatedMasterKey guards against existing workers
// losing the mint when the control plane rotates its master key: an identity
// token signed with the old key still mints, and the WorkerToken is signed
// with the new one.
func TestMintAcceptsIdentityOfRotatedMasterKey(t *testing.T) {
	db, err := controlstore.OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "m.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	oldKey, _ := token.NewMasterKey("k1")
	newKey, _ := token.NewMasterKey("k2")
	log := slog.New(slog.DiscardHandler)
	idTok, err := mint.New(db, oldKey, log).IssueIdentity(t.Context(), "demo", "dev", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.UpsertUser(t.Context(), controlstore.User{ID: "u1", TokenHash: "h"}); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateConversation(t.Context(), controlstore.Conversation{ID: "c1", Tenant: "demo", Env: "dev", UserID: "u1", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mint.New(db, newKey, log, oldKey))
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{"conversation_id":"c1"}`))
	req.Header.Set("Authorization", "Bearer "+idTok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var mr contract.MintResponse
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&mr) != nil {
		t.Fatalf("mint with a rotated-out identity key: status %d", resp.StatusCode)
	}
	if _, err := token.NewVerifier(token.PurposeGateway, newKey.Derive(token.PurposeGateway, "", "")).Verify(mr.Token); err != nil {
		t.Errorf("WorkerToken not signed with the new key: %v", err)
	}
}

// TestMintRefusesARetiredIdentityByItself: a rotated identity token's
// grace ends at its retire time whether or not any reconcile of its
// tenant-env comes to revoke it (issue 27: with the command line alone, or
// a resync that does not come, the old token kept working).
func TestMintRefusesARetiredIdentityByItself(t *testing.T) {
	f := newFixture(t)
	c, err := token.NewVerifier(token.PurposeIdentity, f.master.Derive(token.PurposeIdentity, "", "")).Verify(f.identity)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.db.RetireIdentityToken(t.Context(), c.ID, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if status, body := f.post(t, "Bearer "+f.identity, "application/json", mintBody(convID)); status != http.StatusOK {
		t.Fatalf("within its grace: got %d (%s), want 200", status, body)
	}
	if err := f.db.RetireIdentityToken(t.Context(), c.ID, time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	status, body := f.post(t, "Bearer "+f.identity, "application/json", mintBody(convID))
	if status != http.StatusUnauthorized || !strings.Contains(string(body), "retired") {
		t.Fatalf("past its retire time: got %d (%s), want 401 saying it retired", status, body)
	}
}
