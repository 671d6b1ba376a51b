package localproxy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/talkide/talkide/internal/token"
)

// Reasons an identity token stopped minting (IdentityFailure.Reason).
const (
	// IdentityRevoked: the mint answered 401 saying the token is revoked.
	IdentityRevoked = "revoked"
	// IdentityExpired: the token's exp has passed.
	IdentityExpired = "expired"
	// IdentityRefused: the mint answered 401 for another reason (a token
	// this control plane did not issue, or signed with a key it no longer
	// has).
	IdentityRefused = "refused"
)

// IdentityRecheck is how often, at most, an Identity read from a file
// looks at the file again (one stat; a read only when it changed). A 401
// from the mint makes it read the file at once.
const IdentityRecheck = time.Second

// maxIdentityFile bounds what is read of the identity token file; real
// tokens are under 1 KB.
const maxIdentityFile = 64 << 10

// IdentityFailure says why the worker's current identity token no longer
// mints. It names the token by fingerprint and token id, never by value.
type IdentityFailure struct {
	// Reason is IdentityRevoked, IdentityExpired or IdentityRefused.
	Reason string
	// Fingerprint is token.Fingerprint of the token; JTI its token id
	// (what `talkide-controlplane revoke-identity -jti` takes).
	Fingerprint, JTI string
	// Msg is the mint's message; empty when the worker found the expiry
	// itself.
	Msg string
	// Since is when the worker found it.
	Since time.Time
}

func (f *IdentityFailure) Error() string {
	s := fmt.Sprintf("identity token %s (jti %s) %s", f.Fingerprint, f.JTI, f.Reason)
	if f.Msg != "" {
		s += ": mint said: " + f.Msg
	}
	return s
}

// IdentityConfig configures NewIdentity.
type IdentityConfig struct {
	// Token is a fixed identity token [TALKIDE_WORKER_IDENTITY_TOKEN]; File
	// is a file holding it [TALKIDE_WORKER_IDENTITY_TOKEN_FILE], which may
	// be replaced at any time (a kubelet secret volume swaps it through its
	// "..data" symlink). Exactly one must be set.
	Token, File string
	// Tenant and Env are the worker's tenant-env: every token taken must be
	// an unexpired identity token bound to them (ParseIdentityToken).
	// Required.
	Tenant, Env string
	// Logger receives token changes and refused tokens (by fingerprint).
	// Nil means slog.Default().
	Logger *slog.Logger
}

// Identity is the worker's identity token, the credential MintClient
// presents to the mint. It is fixed or read from a file; a file is looked
// at again at most once per IdentityRecheck, and at once after the mint
// refused the token in use (MintClient does that), so a token rotated into
// the file is taken without a restart and without a failed mint.
//
// A file that is missing, empty or unreadable keeps the last good token, and
// so does a token that fails ParseIdentityToken (another tenant-env's, not an
// identity token, expired); each such refusal is logged once per file
// version. When the mint refuses the token in use and the file holds no other,
// or the token has expired, Identity records an IdentityFailure; a new token
// taken from the file, or (for a refusal) a later successful mint, clears it.
// Changed tells a watcher about both. Safe for concurrent use.
type Identity struct {
	path        string // "" for a fixed token
	tenant, env string
	log         *slog.Logger
	now         func() time.Time
	changed     chan struct{} // capacity 1: a pending send means "look again"

	mu sync.Mutex
	// cur is the token in use; guarded by mu.
	cur identityToken
	// seen is the file version last examined (taken or refused), so an
	// unchanged file is not read again; nil after a failed read. Guarded
	// by mu.
	seen os.FileInfo
	// checked is when the file was last looked at; guarded by mu.
	checked time.Time
	// problem is the last read problem logged, so a missing file is
	// logged once, not every second; guarded by mu.
	problem string
	// failure is non-nil while cur cannot mint; guarded by mu.
	failure *IdentityFailure
}

// identityToken is a token with the claims Identity needs.
type identityToken struct {
	raw, fingerprint, jti string
	exp                   time.Time // zero: no expiry
}

// NewIdentity returns the Identity of c, having read c.File once. It
// fails when c sets both or neither of Token and File, when the file cannot
// be read or is empty, or when the token fails ParseIdentityToken; error
// messages name the setting and never quote the token.
func NewIdentity(c IdentityConfig) (*Identity, error) {
	if (c.Token == "") == (c.File == "") {
		return nil, errors.New("set one of TALKIDE_WORKER_IDENTITY_TOKEN and TALKIDE_WORKER_IDENTITY_TOKEN_FILE")
	}
	id := &Identity{path: c.File, tenant: c.Tenant, env: c.Env, log: c.Logger, now: time.Now, changed: make(chan struct{}, 1)}
	if id.log == nil {
		id.log = slog.Default()
	}
	if c.File == "" {
		t, err := id.parse(c.Token)
		if err != nil {
			return nil, fmt.Errorf("TALKIDE_WORKER_IDENTITY_TOKEN: %w", err)
		}
		id.cur = t
		return id, nil
	}
	raw, fi, err := readIdentityFile(c.File)
	if err != nil {
		return nil, fmt.Errorf("TALKIDE_WORKER_IDENTITY_TOKEN_FILE: %w", err)
	}
	t, err := id.parse(raw)
	if err != nil {
		return nil, fmt.Errorf("TALKIDE_WORKER_IDENTITY_TOKEN_FILE %s: %w", c.File, err)
	}
	id.cur, id.seen, id.checked = t, fi, id.now()
	return id, nil
}

// ParseIdentityToken reads the claims of tok without verifying its
// signature (the worker has no key; the mint verifies) and checks that it is
// a whole HS256 token, an identity token, bound to tenant/env, whose exp has
// not passed at now. Its errors say which check failed and never quote the
// token.
func ParseIdentityToken(tok, tenant, env string, now time.Time) (*token.Claims, error) {
	parts := strings.Split(tok, ".")
	if len(tok) > 4096 || len(parts) != 3 {
		return nil, errors.New("not a token")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, errors.New("not a token")
	}
	var c token.Claims
	if err := json.Unmarshal(payload, &c); err != nil {
		return nil, errors.New("not a token")
	}
	// An HS256 signature is 32 bytes: a token cut short while its file was
	// being written is not taken.
	if sig, err := base64.RawURLEncoding.DecodeString(parts[2]); err != nil || len(sig) != 32 {
		return nil, errors.New("not a token (signature cut short?)")
	}
	if c.Purpose != token.PurposeIdentity {
		return nil, fmt.Errorf("a %q token, want an identity token", c.Purpose)
	}
	if c.Tenant != tenant || c.Env != env {
		return nil, fmt.Errorf("bound to %s/%s, but this worker serves %s/%s", c.Tenant, c.Env, tenant, env)
	}
	if c.ExpiresAt != nil && !now.Before(c.ExpiresAt.Time) {
		return nil, fmt.Errorf("expired at %s", c.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return &c, nil
}

func (id *Identity) parse(raw string) (identityToken, error) {
	c, err := ParseIdentityToken(raw, id.tenant, id.env, id.now())
	if err != nil {
		return identityToken{}, err
	}
	t := identityToken{raw: raw, fingerprint: token.Fingerprint(raw), jti: c.ID}
	if c.ExpiresAt != nil {
		t.exp = c.ExpiresAt.Time
	}
	return t, nil
}

// readIdentityFile reads the token in path (surrounding white space
// removed) and the file's identity, both of the same open file.
func readIdentityFile(path string) (string, os.FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxIdentityFile))
	if err != nil {
		return "", nil, fmt.Errorf("read %s: %w", path, err)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return "", nil, fmt.Errorf("%s is empty", path)
	}
	return string(b), fi, nil
}

// sameFile reports whether a and b are the same version of one file.
func sameFile(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// Token returns the identity token to present to the mint, looking at the
// file first when IdentityRecheck has passed since the last look.
func (id *Identity) Token() string {
	id.mu.Lock()
	defer id.mu.Unlock()
	id.reloadLocked(false)
	return id.cur.raw
}

// Failure returns why the current token cannot mint, or nil while it can
// (as far as the worker knows).
func (id *Identity) Failure() *IdentityFailure {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.failure == nil {
		return nil
	}
	f := *id.failure
	return &f
}

// Expiry returns the current token's exp (zero when it has none).
func (id *Identity) Expiry() time.Time {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.cur.exp
}

// Changed is signalled (capacity one, never closed) after the token in use
// changed or a failure was recorded or cleared.
func (id *Identity) Changed() <-chan struct{} { return id.changed }

// Refresh looks at the file (when IdentityRecheck has passed) and records
// an IdentityExpired failure when the current token's exp has passed and
// the file, read again, holds no successor. A watcher calls it on a timer.
func (id *Identity) Refresh() {
	id.mu.Lock()
	defer id.mu.Unlock()
	id.reloadLocked(false)
	if id.failure != nil || id.cur.exp.IsZero() || id.now().Before(id.cur.exp) {
		return
	}
	if id.reloadLocked(true) {
		return
	}
	id.failLocked(IdentityExpired, "")
}

// refused tells id that the mint answered 401 with message msg for tok. It
// reads the file again at once; when the token in use is (now) another
// one, it returns that one to retry with. Otherwise it records the failure
// and returns false.
func (id *Identity) refused(tok, msg string) (string, bool) {
	id.mu.Lock()
	defer id.mu.Unlock()
	id.reloadLocked(true)
	if id.cur.raw != tok {
		return id.cur.raw, true // rotated: another caller or this read took the successor
	}
	reason := IdentityRefused
	switch {
	case !id.cur.exp.IsZero() && !id.now().Before(id.cur.exp):
		reason = IdentityExpired
	case strings.Contains(msg, "revoked"):
		reason = IdentityRevoked
	}
	if id.failure == nil || id.failure.Reason != reason {
		id.failLocked(reason, msg)
	}
	return "", false
}

// accepted tells id that the mint accepted tok: a refusal recorded for it
// is over (an expiry is not: the mint allows a little clock skew).
func (id *Identity) accepted(tok string) {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.failure == nil || id.failure.Reason == IdentityExpired || id.cur.raw != tok {
		return
	}
	id.log.Info("the mint accepts the identity token again", "token", id.cur.fingerprint, "jti", id.cur.jti)
	id.failure = nil
	id.notify()
}

func (id *Identity) failLocked(reason, msg string) {
	id.failure = &IdentityFailure{Reason: reason, Fingerprint: id.cur.fingerprint, JTI: id.cur.jti, Msg: msg, Since: id.now()}
	id.notify()
}

func (id *Identity) notify() {
	select {
	case id.changed <- struct{}{}:
	default:
	}
}

// reloadLocked looks at the file when force is set or IdentityRecheck has
// passed, takes a new token that passes the checks, and reports whether it
// did. A fixed token never changes.
func (id *Identity) reloadLocked(force bool) bool {
	if id.path == "" {
		return false
	}
	now := id.now()
	if !force && now.Sub(id.checked) < IdentityRecheck {
		return false
	}
	id.checked = now
	if !force && id.seen != nil {
		if fi, err := os.Stat(id.path); err == nil && sameFile(fi, id.seen) {
			return false
		}
	}
	raw, fi, err := readIdentityFile(id.path)
	if err != nil {
		// Missing or empty during a swap, or gone: keep the last good
		// token and look again next time.
		id.seen = nil
		if msg := err.Error(); msg != id.problem {
			id.problem = msg
			id.log.Warn("identity token file unreadable; keeping the current token", "err", err, "token", id.cur.fingerprint)
		}
		return false
	}
	id.problem = ""
	seenBefore := sameFile(fi, id.seen)
	id.seen = fi
	if raw == id.cur.raw {
		return false
	}
	t, err := id.parse(raw)
	if err != nil {
		if !seenBefore { // logged once per file version
			id.log.Error("identity token in the file refused; keeping the current token",
				"file", id.path, "err", err, "refused_token", token.Fingerprint(raw), "token", id.cur.fingerprint)
		}
		return false
	}
	old := id.cur
	id.cur = t
	id.log.Info("identity token replaced from the file", "file", id.path, "token", t.fingerprint, "jti", t.jti, "previous_token", old.fingerprint)
	id.failure = nil // the failure was the old token's
	id.notify()
	return true
}
