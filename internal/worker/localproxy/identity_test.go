package localproxy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker/localproxy"
)

// tinyMint is a mint endpoint on loopback that accepts the identity tokens
// of a set the test controls and answers any other with 401 and refusal.
type tinyMint struct {
	URL *url.URL

	mu sync.Mutex
	// accepted is the set of tokens minted for; guarded by mu.
	accepted map[string]bool
	// refusal is the message of a 401; guarded by mu.
	refusal string
	// calls lists the identity token of every call in order, and minted
	// counts the 200s per token; guarded by mu.
	calls  []string
	minted map[string]int
}

func newTinyMint(t *testing.T, accepted ...string) *tinyMint {
	t.Helper()
	m := &tinyMint{minted: map[string]int{}, refusal: "identity token revoked"}
	m.accept(accepted...)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok := httpapi.BearerToken(r)
		m.mu.Lock()
		m.calls = append(m.calls, tok)
		ok, refusal := m.accepted[tok], m.refusal
		if ok {
			m.minted[tok]++
		}
		n := len(m.calls)
		m.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusUnauthorized)
			json.NewEncoder(w).Encode(contract.ErrorBody{Error: contract.ErrorDetail{Type: contract.ErrTypeUnauthorized, Message: refusal}})
			return
		}
		json.NewEncoder(w).Encode(contract.MintResponse{Token: fmt.Sprintf("wt-%d", n), ExpiresAt: time.Now().Add(2 * time.Minute).UTC()})
	}))
	t.Cleanup(srv.Close)
	m.URL, _ = url.Parse(srv.URL)
	return m
}

// accept makes toks the only tokens the mint accepts.
func (m *tinyMint) accept(toks ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.accepted = map[string]bool{}
	for _, tok := range toks {
		m.accepted[tok] = true
	}
}

func (m *tinyMint) setRefusal(msg string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refusal = msg
}

func (m *tinyMint) mintedWith(tok string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.minted[tok]
}

func (m *tinyMint) callLog() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.calls...)
}

// kubeletDir lays a token out as a kubelet secret volume does:
// <dir>/identity-token → ..data/identity-token, ..data → ..<version>, the
// version directory holding the file. Swap replaces it the kubelet's way:
// a new version directory, a ..data_tmp link renamed over ..data, the old
// directory removed.
type kubeletDir struct {
	t       *testing.T
	dir     string
	version int
}

func newKubeletDir(t *testing.T, tok string) *kubeletDir {
	k := &kubeletDir{t: t, dir: t.TempDir()}
	k.writeVersion(tok)
	if err := os.Symlink(k.versionDir(), filepath.Join(k.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "identity-token"), k.path()); err != nil {
		t.Fatal(err)
	}
	return k
}

func (k *kubeletDir) path() string { return filepath.Join(k.dir, "identity-token") }

func (k *kubeletDir) versionDir() string {
	return fmt.Sprintf("..2026_01_01_00_00_%02d.%d", k.version, k.version)
}

func (k *kubeletDir) writeVersion(tok string) {
	k.version++
	d := filepath.Join(k.dir, k.versionDir())
	if err := os.Mkdir(d, 0o755); err != nil {
		k.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "identity-token"), []byte(tok), 0o644); err != nil {
		k.t.Fatal(err)
	}
}

// swap puts tok in place as the kubelet does when the Secret changes.
func (k *kubeletDir) swap(tok string) {
	old := filepath.Join(k.dir, k.versionDir())
	k.writeVersion(tok)
	tmp := filepath.Join(k.dir, "..data_tmp")
	if err := os.Symlink(k.versionDir(), tmp); err != nil {
		k.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.dir, "..data")); err != nil {
		k.t.Fatal(err)
	}
	if err := os.RemoveAll(old); err != nil {
		k.t.Fatal(err)
	}
}

// writeFile replaces path's content atomically (temp file and rename).
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time // guarded by mu
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fileIdentity returns the Identity of demo/dev read from path, its log,
// and, when frozen is set, the fake clock it reads (nil otherwise).
func fileIdentity(t *testing.T, path string, frozen bool) (*localproxy.Identity, *platformtest.LogBuffer, *fakeClock) {
	t.Helper()
	logs := &platformtest.LogBuffer{}
	id, err := localproxy.NewIdentity(localproxy.IdentityConfig{File: path, Tenant: "demo", Env: "dev",
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	if !frozen {
		return id, logs, nil
	}
	clk := &fakeClock{t: time.Now()}
	localproxy.SetClock(id, clk.now)
	return id, logs, clk
}

func jti(t *testing.T, tok string) string {
	t.Helper()
	c, err := token.NewVerifier(token.PurposeIdentity, testMaster.Derive(token.PurposeIdentity, "", "")).Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	return c.ID
}

// waitFor polls cond until it holds; the bound only turns a hang into a
// failure.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: did not happen", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkNoTokens fails when the log holds any of toks.
func checkNoTokens(t *testing.T, logs *platformtest.LogBuffer, toks ...string) {
	t.Helper()
	l := logs.String()
	for _, tok := range toks {
		if strings.Contains(l, tok) {
			t.Errorf("log contains an identity token (fingerprint %s):\n%s", token.Fingerprint(tok), l)
		}
	}
}

func changed(id *localproxy.Identity) bool {
	select {
	case <-id.Changed():
		return true
	default:
		return false
	}
}

// TestMintRotationCostsNoFailedMint rotates the identity token the way the
// control plane does while eight goroutines mint in a loop: B is written
// into the (kubelet-style) file while A is still valid, then the mint
// refuses A. Not one mint may fail: a 401 for A makes the client read the
// file at once and retry with B.
func TestMintRotationCostsNoFailedMint(t *testing.T) {
	a, b := signIdentity("demo", "dev", time.Hour), signIdentity("demo", "dev", time.Hour)
	dir := newKubeletDir(t, a)
	id, logs, _ := fileIdentity(t, dir.path(), false)
	m := newTinyMint(t, a)
	mc := &localproxy.MintClient{Base: m.URL, Identity: id}

	var failed atomic.Int64
	var firstErr atomic.Pointer[error]
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := mc.Mint(t.Context(), convA); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	waitFor(t, "mints with A", func() bool { return m.mintedWith(a) >= 50 })
	m.accept(a, b) // the grace: both valid
	dir.swap(b)
	m.accept(b) // A revoked
	refusedA := len(m.callLog())
	waitFor(t, "mints with B after A was revoked", func() bool { return m.mintedWith(b) >= 200 })
	close(stop)
	wg.Wait()

	if n := failed.Load(); n != 0 {
		t.Errorf("failed mints: got %d (first: %v), want 0", n, *firstErr.Load())
	}
	if f := id.Failure(); f != nil {
		t.Errorf("Failure: got %v, want nil", f)
	}
	if got := id.Token(); got != b {
		t.Errorf("Token after the rotation: got fingerprint %s, want B's %s", token.Fingerprint(got), token.Fingerprint(b))
	}
	refused := 0
	for _, tok := range m.callLog()[refusedA:] {
		if tok == a {
			refused++
		}
	}
	t.Logf("mints refused for A after its revocation and retried with B: %d", refused)
	checkNoTokens(t, logs, a, b)
}

// TestMintRetriesAtOnceAfterARefusal freezes the clock so the file is
// never looked at on the timer: only the 401 makes the client read it, and
// the same Mint call succeeds with the successor.
func TestMintRetriesAtOnceAfterARefusal(t *testing.T) {
	a, b := signIdentity("demo", "dev", time.Hour), signIdentity("demo", "dev", time.Hour)
	path := filepath.Join(t.TempDir(), "identity-token")
	writeFile(t, path, a+"\n")
	id, logs, _ := fileIdentity(t, path, true)
	m := newTinyMint(t, a)
	mc := &localproxy.MintClient{Base: m.URL, Identity: id}
	if _, err := mc.Mint(t.Context(), convA); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, b+"\n")
	m.accept(b)
	if _, err := mc.Mint(t.Context(), convA); err != nil {
		t.Fatalf("Mint after the rotation: got %v, want a WorkerToken minted with B", err)
	}
	want := []string{token.Fingerprint(a), token.Fingerprint(a), token.Fingerprint(b)}
	var got []string
	for _, tok := range m.callLog() {
		got = append(got, token.Fingerprint(tok))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("identity tokens presented (fingerprints): got %v, want %v (A, A refused, B)", got, want)
	}
	if f := id.Failure(); f != nil {
		t.Errorf("Failure: got %v, want nil", f)
	}
	checkNoTokens(t, logs, a, b)
}

// TestIdentityFilePicksUpKubeletSwap swaps the Secret's volume as the
// kubelet does (a new ..data symlink renamed into place, the old version
// removed) and checks that the token in use follows without a mint refusal,
// once IdentityRecheck has passed.
func TestIdentityFilePicksUpKubeletSwap(t *testing.T) {
	a, b, c := signIdentity("demo", "dev", time.Hour), signIdentity("demo", "dev", time.Hour), signIdentity("demo", "dev", time.Hour)
	dir := newKubeletDir(t, a)
	id, logs, clk := fileIdentity(t, dir.path(), true)
	if got := id.Token(); got != a {
		t.Fatalf("Token: got fingerprint %s, want A's", token.Fingerprint(got))
	}
	dir.swap(b)
	if got := id.Token(); got != a {
		t.Errorf("Token within IdentityRecheck of the last look: got fingerprint %s, want A's (the file is looked at once per %s)", token.Fingerprint(got), localproxy.IdentityRecheck)
	}
	clk.advance(localproxy.IdentityRecheck)
	if got := id.Token(); got != b {
		t.Errorf("Token after the swap: got fingerprint %s, want B's %s", token.Fingerprint(got), token.Fingerprint(b))
	}
	if !changed(id) {
		t.Error("Changed not signalled after the token changed")
	}
	dir.swap(c)
	clk.advance(localproxy.IdentityRecheck)
	id.Refresh()
	if got := id.Token(); got != c {
		t.Errorf("Token after a second swap: got fingerprint %s, want C's %s", token.Fingerprint(got), token.Fingerprint(c))
	}
	if l := logs.String(); !strings.Contains(l, token.Fingerprint(b)) || !strings.Contains(l, token.Fingerprint(c)) {
		t.Errorf("log does not name the new tokens by fingerprint:\n%s", l)
	}
	checkNoTokens(t, logs, a, b, c)
}

// TestIdentityFileKeepsLastGoodToken puts the file through what a swap or a
// careless writer can leave behind for a moment; minting goes on with the
// last good token throughout.
func TestIdentityFileKeepsLastGoodToken(t *testing.T) {
	a, b := signIdentity("demo", "dev", time.Hour), signIdentity("demo", "dev", time.Hour)
	dir := t.TempDir()
	path := filepath.Join(dir, "identity-token")
	writeFile(t, path, a)
	id, logs, clk := fileIdentity(t, path, true)
	m := newTinyMint(t, a)
	mc := &localproxy.MintClient{Base: m.URL, Identity: id}
	steps := []struct {
		name string
		do   func()
	}{
		{"file missing", func() { os.Remove(path) }},
		{"file empty", func() { writeFile(t, path, "") }},
		{"white space only", func() { writeFile(t, path, "\n \n") }},
		{"half-written token", func() { writeFile(t, path, a[:len(a)/2]) }},
		{"signature cut short", func() { writeFile(t, path, b[:len(b)-3]) }},
		{"dangling symlink", func() { os.Remove(path); os.Symlink(filepath.Join(dir, "..data", "identity-token"), path) }},
		{"a directory", func() { os.Remove(path); os.Mkdir(path, 0o700) }},
	}
	for _, s := range steps {
		s.do()
		clk.advance(localproxy.IdentityRecheck)
		if got := id.Token(); got != a {
			t.Errorf("%s: Token got fingerprint %s, want A's", s.name, token.Fingerprint(got))
		}
		if _, err := mc.Mint(t.Context(), convA); err != nil {
			t.Errorf("%s: Mint: %v", s.name, err)
		}
	}
	os.Remove(path)
	writeFile(t, path, b)
	m.accept(b)
	clk.advance(localproxy.IdentityRecheck)
	if got := id.Token(); got != b {
		t.Errorf("Token once the file holds B: got fingerprint %s, want B's", token.Fingerprint(got))
	}
	if f := id.Failure(); f != nil {
		t.Errorf("Failure: got %v, want nil", f)
	}
	checkNoTokens(t, logs, a, b, a[:len(a)/2], b[:len(b)-3])
}

// TestIdentityFileRefusesForeignTokens writes tokens the worker must not
// take into the file: another tenant-env's identity token, a WorkerToken of
// its own tenant-env, an expired identity token. Each is refused and logged
// by fingerprint; the old token stays in use, and when the mint then refuses
// it the failure names the old token, not the refused one.
func TestIdentityFileRefusesForeignTokens(t *testing.T) {
	a := signIdentity("demo", "dev", time.Hour)
	gatewayTok, err := token.NewSigner(token.PurposeGateway, testMaster.Derive(token.PurposeGateway, "", "")).Sign(token.Claims{Tenant: "demo", Env: "dev"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, tok, logged string
	}{
		{"other tenant", signIdentity("globex", "dev", time.Hour), "bound to globex/dev"},
		{"other env", signIdentity("demo", "prod", time.Hour), "bound to demo/prod"},
		{"WorkerToken", gatewayTok, "want an identity token"},
		{"expired", signIdentity("demo", "dev", -time.Minute), "expired at"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "identity-token")
			writeFile(t, path, a)
			id, logs, clk := fileIdentity(t, path, true)
			m := newTinyMint(t, a, tc.tok) // even a mint that took it must not see it
			mc := &localproxy.MintClient{Base: m.URL, Identity: id}
			writeFile(t, path, tc.tok)
			clk.advance(localproxy.IdentityRecheck)
			if got := id.Token(); got != a {
				t.Fatalf("Token: got fingerprint %s, want A's (the refused token must not be taken)", token.Fingerprint(got))
			}
			l := logs.String()
			if !strings.Contains(l, "refused") || !strings.Contains(l, token.Fingerprint(tc.tok)) || !strings.Contains(l, tc.logged) {
				t.Errorf("log: want the refusal with the token's fingerprint %s and %q:\n%s", token.Fingerprint(tc.tok), tc.logged, l)
			}
			// Looked at again, the same file version is not logged again.
			clk.advance(localproxy.IdentityRecheck)
			id.Token()
			if n := strings.Count(logs.String(), token.Fingerprint(tc.tok)); n != 1 {
				t.Errorf("refusal logged %d times for one file version, want once", n)
			}

			m.accept() // A revoked; the file holds only the refused token
			if _, err := mc.Mint(t.Context(), convA); err == nil {
				t.Fatal("Mint with A revoked: got a WorkerToken, want the refusal")
			}
			f := id.Failure()
			if f == nil || f.Reason != localproxy.IdentityRevoked || f.Fingerprint != token.Fingerprint(a) || f.JTI != jti(t, a) {
				t.Errorf("Failure: got %+v, want revoked for A (fingerprint %s, jti %s)", f, token.Fingerprint(a), jti(t, a))
			}
			for _, tok := range m.callLog() {
				if tok == tc.tok {
					t.Errorf("the refused token was presented to the mint")
				}
			}
			checkNoTokens(t, logs, a, tc.tok)
		})
	}
}

// TestIdentityFailure checks what the worker learns when its token stops
// minting: the reason (from the mint's answer, or the token's own exp),
// the token's fingerprint and jti, a signal on Changed; and that a
// successor in the file, or the mint accepting the token again after a
// refusal, clears it.
func TestIdentityFailure(t *testing.T) {
	cases := []struct {
		name    string
		refusal string        // the mint's 401 message
		after   time.Duration // clock moved before the refused mint
		want    string
	}{
		{"revoked", "identity token revoked", 0, localproxy.IdentityRevoked},
		{"refused", "identity token not issued by this control plane", 0, localproxy.IdentityRefused},
		{"invalid", "invalid identity token", 0, localproxy.IdentityRefused},
		{"expired", "invalid identity token", 2 * time.Hour, localproxy.IdentityExpired},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := signIdentity("demo", "dev", time.Hour), signIdentity("demo", "dev", 3*time.Hour)
			path := filepath.Join(t.TempDir(), "identity-token")
			writeFile(t, path, a)
			id, logs, clk := fileIdentity(t, path, true)
			m := newTinyMint(t)
			m.setRefusal(tc.refusal)
			mc := &localproxy.MintClient{Base: m.URL, Identity: id}
			clk.advance(tc.after)
			_, err := mc.Mint(t.Context(), convA)
			var me *localproxy.MintError
			if !errors.As(err, &me) || me.Status != http.StatusUnauthorized {
				t.Fatalf("Mint: got %v, want the mint's 401", err)
			}
			f := id.Failure()
			if f == nil || f.Reason != tc.want || f.Fingerprint != token.Fingerprint(a) || f.JTI != jti(t, a) || f.Msg != tc.refusal {
				t.Fatalf("Failure: got %+v, want %s for A (fingerprint %s, jti %s) with the mint's message", f, tc.want, token.Fingerprint(a), jti(t, a))
			}
			if !changed(id) {
				t.Error("Changed not signalled for the failure")
			}
			if strings.Contains(f.Error(), a) {
				t.Errorf("IdentityFailure.Error quotes the token: %s", f.Error())
			}
			// Refused again: the failure stays as first recorded.
			mc.Mint(t.Context(), convA)
			if g := id.Failure(); g == nil || !g.Since.Equal(f.Since) {
				t.Errorf("Failure after a second refusal: got %+v, want the first one kept", g)
			}
			changed(id)

			if tc.want != localproxy.IdentityExpired {
				// The mint takes the token again (a control plane
				// restored from a backup, say): the failure is over.
				m.accept(a)
				if _, err := mc.Mint(t.Context(), convA); err != nil {
					t.Fatal(err)
				}
				if g := id.Failure(); g != nil {
					t.Errorf("Failure after the mint accepted the token again: got %+v, want nil", g)
				}
				if !changed(id) {
					t.Error("Changed not signalled when the failure cleared")
				}
				m.accept()
				mc.Mint(t.Context(), convA)
				if id.Failure() == nil {
					t.Fatal("Failure: got nil after a new refusal")
				}
				changed(id)
			}
			// A successor written to the file clears it at the next look.
			writeFile(t, path, b)
			clk.advance(localproxy.IdentityRecheck)
			id.Refresh()
			if g := id.Failure(); g != nil {
				t.Errorf("Failure after a successor appeared: got %+v, want nil", g)
			}
			if !changed(id) {
				t.Error("Changed not signalled for the successor")
			}
			if got := id.Token(); got != b {
				t.Errorf("Token: got fingerprint %s, want the successor's", token.Fingerprint(got))
			}
			checkNoTokens(t, logs, a, b)
		})
	}
}

// TestIdentityExpiryFoundWithoutMint: Refresh (the worker's watcher calls
// it at the token's exp) records the expiry by itself, unless the file
// holds a successor by then.
func TestIdentityExpiryFoundWithoutMint(t *testing.T) {
	a, b := signIdentity("demo", "dev", time.Hour), signIdentity("demo", "dev", 3*time.Hour)
	path := filepath.Join(t.TempDir(), "identity-token")
	writeFile(t, path, a)
	id, _, clk := fileIdentity(t, path, true)
	if exp := id.Expiry(); exp.Before(time.Now().Add(59*time.Minute)) || exp.After(time.Now().Add(61*time.Minute)) {
		t.Errorf("Expiry: got %s, want A's exp about an hour from now", exp)
	}
	clk.advance(30 * time.Minute)
	id.Refresh()
	if f := id.Failure(); f != nil {
		t.Fatalf("Failure before exp: got %+v, want nil", f)
	}
	clk.advance(time.Hour)
	id.Refresh()
	f := id.Failure()
	if f == nil || f.Reason != localproxy.IdentityExpired || f.JTI != jti(t, a) || f.Msg != "" {
		t.Fatalf("Failure after exp: got %+v, want expired for A with no mint message", f)
	}

	// With a successor in the file when exp passes, there is no failure.
	// The file is written without the clock moving: Refresh reads it
	// because the token in use has expired.
	path2 := filepath.Join(t.TempDir(), "identity-token")
	writeFile(t, path2, a)
	id2, _, clk2 := fileIdentity(t, path2, true)
	clk2.advance(90 * time.Minute)
	id2.Token() // looks at the file now; the next look is due in IdentityRecheck
	writeFile(t, path2, b)
	id2.Refresh()
	if f := id2.Failure(); f != nil {
		t.Errorf("Failure with a successor in the file: got %+v, want nil", f)
	}
	if got := id2.Token(); got != b {
		t.Errorf("Token: got fingerprint %s, want the successor's", token.Fingerprint(got))
	}
}

func TestNewIdentityRefusesBadConfig(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other")
	writeFile(t, other, signIdentity("globex", "dev", time.Hour))
	empty := filepath.Join(dir, "empty")
	writeFile(t, empty, "\n")
	cases := []struct {
		name string
		c    localproxy.IdentityConfig
		want string
	}{
		{"neither", localproxy.IdentityConfig{}, "set one of TALKIDE_WORKER_IDENTITY_TOKEN and TALKIDE_WORKER_IDENTITY_TOKEN_FILE"},
		{"both", localproxy.IdentityConfig{Token: identity, File: other}, "set one of"},
		{"missing file", localproxy.IdentityConfig{File: filepath.Join(dir, "nope")}, "TALKIDE_WORKER_IDENTITY_TOKEN_FILE"},
		{"empty file", localproxy.IdentityConfig{File: empty}, "is empty"},
		{"other tenant in file", localproxy.IdentityConfig{File: other}, "TALKIDE_WORKER_IDENTITY_TOKEN_FILE " + other + ": bound to globex/dev"},
		{"other tenant as token", localproxy.IdentityConfig{Token: signIdentity("globex", "dev", time.Hour)}, "TALKIDE_WORKER_IDENTITY_TOKEN: bound to globex/dev"},
		{"not a token", localproxy.IdentityConfig{Token: "abc"}, "TALKIDE_WORKER_IDENTITY_TOKEN: not a token"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.Tenant, tc.c.Env, tc.c.Logger = "demo", "dev", slog.New(slog.DiscardHandler)
			_, err := localproxy.NewIdentity(tc.c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
