package token

import (
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Purpose says what a token is for. Each purpose has its own key material and
// audience; a token of one purpose is never accepted for another.
type Purpose string

const (
	// PurposeIdentity is the worker's long-lived identity token, presented
	// only to the mint endpoint.
	PurposeIdentity Purpose = "identity"
	// PurposeGateway is a WorkerToken: short-lived, scoped to one
	// conversation, presented to the gateway-proxy and reporting endpoints.
	PurposeGateway Purpose = "gateway"
	// PurposeWorkerRequest signs one control plane → worker request.
	PurposeWorkerRequest Purpose = "worker-request"
)

// Issuer is the "iss" of every token the control plane signs.
const Issuer = "talkide-control-plane"

// Default lifetimes.
const (
	IdentityTTL      = 90 * 24 * time.Hour
	WorkerTokenTTL   = 120 * time.Second
	RequestTokenTTL  = 60 * time.Second
	DefaultClockSkew = 5 * time.Second
)

// Audience returns the "aud" a token of purpose p must carry. Request tokens
// are addressed to one worker: tenant and env are part of the audience.
func Audience(p Purpose, tenant, env string) string {
	switch p {
	case PurposeIdentity:
		return "talkide-mint"
	case PurposeGateway:
		return "talkide-gateway"
	case PurposeWorkerRequest:
		return "talkide-worker:" + tenant + "/" + env
	}
	return ""
}

// Errors returned by Verifier.Verify. Every error Verify returns wraps exactly
// one of them, so callers can map them to HTTP statuses.
var (
	ErrMalformed    = errors.New("token malformed")
	ErrSignature    = errors.New("token signature invalid")
	ErrUnknownKey   = errors.New("token key id unknown")
	ErrExpired      = errors.New("token expired")
	ErrNotYetValid  = errors.New("token not yet valid")
	ErrAudience     = errors.New("token audience mismatch")
	ErrPurpose      = errors.New("token purpose mismatch")
	ErrSubject      = errors.New("token subject mismatch")
	ErrMissingClaim = errors.New("token missing required claim")
)

// Claims are the registered claims plus the platform's own. Field names are
// short JSON keys to keep headers small.
type Claims struct {
	jwt.RegisteredClaims

	Purpose Purpose `json:"pur"`
	Tenant  string  `json:"ten"`
	Env     string  `json:"env"`
	// Conversation is the conversation a WorkerToken is scoped to.
	Conversation string `json:"cnv,omitempty"`
	// User is the user a WorkerToken spends for.
	User string `json:"usr,omitempty"`
	// Method, Path and BodySHA256 bind a request token to one HTTP request:
	// the method, the escaped path with query, and the hex SHA-256 of the body.
	Method     string `json:"htm,omitempty"`
	Path       string `json:"htu,omitempty"`
	BodySHA256 string `json:"bh,omitempty"`
}

// Subject formats the "sub" of a token bound to (tenant, env).
func Subject(tenant, env string) string { return tenant + "/" + env }

// Key is one HMAC key with its key id.
type Key struct {
	ID     string
	Secret []byte
}

// MasterKey is the control plane's root secret. Per-purpose keys are derived
// from it with HKDF-SHA256; it never leaves the control plane.
type MasterKey Key

// minSecretLen is the shortest master secret accepted (256 bits).
const minSecretLen = 32

// NewMasterKey returns a fresh random 256-bit master key with the given id.
func NewMasterKey(id string) (MasterKey, error) {
	b := make([]byte, minSecretLen)
	if _, err := rand.Read(b); err != nil {
		return MasterKey{}, fmt.Errorf("read random: %w", err)
	}
	return MasterKey{ID: id, Secret: b}, nil
}

// ParseMasterKey parses "<kid>:<base64url secret>" (the format of
// TALKIDE_MASTER_KEYS entries). The secret must be at least 32 bytes.
func ParseMasterKey(s string) (MasterKey, error) {
	id, enc, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok || id == "" || enc == "" {
		return MasterKey{}, errors.New(`parse master key: want "<kid>:<base64url secret>"`)
	}
	if strings.ContainsAny(id, ".:/ ") {
		return MasterKey{}, fmt.Errorf("parse master key %q: key id must not contain '.', ':', '/' or spaces", id)
	}
	secret, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(enc, "="))
	if err != nil {
		return MasterKey{}, fmt.Errorf("parse master key %q: %w", id, err)
	}
	if len(secret) < minSecretLen {
		return MasterKey{}, fmt.Errorf("parse master key %q: secret is %d bytes, want at least %d", id, len(secret), minSecretLen)
	}
	return MasterKey{ID: id, Secret: secret}, nil
}

// String formats the key as ParseMasterKey reads it. It contains the secret.
func (m MasterKey) String() string {
	return m.ID + ":" + base64.RawURLEncoding.EncodeToString(m.Secret)
}

// Derive returns the key for purpose p. For PurposeWorkerRequest the key is
// specific to (tenant, env); for the other purposes tenant and env are ignored.
func (m MasterKey) Derive(p Purpose, tenant, env string) Key {
	info := "talkide/v1/" + string(p)
	if p == PurposeWorkerRequest {
		info += "/" + tenant + "/" + env
	}
	k, err := hkdf.Key(sha256.New, m.Secret, nil, info, 32)
	if err != nil {
		// hkdf.Key fails only for lengths above 255*32 bytes.
		panic(err)
	}
	return Key{ID: m.ID, Secret: k}
}

// FormatKey formats a derived key as "<kid>:<base64url secret>", the format of
// TALKIDE_WORKER_REQUEST_KEYS entries.
func FormatKey(k Key) string {
	return k.ID + ":" + base64.RawURLEncoding.EncodeToString(k.Secret)
}

// ParseKeys parses a comma-separated list of "<kid>:<base64url secret>";
// key ids must be distinct.
func ParseKeys(s string) ([]Key, error) {
	var keys []Key
	for part := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		mk, err := ParseMasterKey(part)
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			if k.ID == mk.ID {
				return nil, fmt.Errorf("parse keys: key id %q given twice (each key needs its own id)", mk.ID)
			}
		}
		keys = append(keys, Key(mk))
	}
	if len(keys) == 0 {
		return nil, errors.New("parse keys: no key given")
	}
	return keys, nil
}

// Signer signs tokens of one purpose with one key.
type Signer struct {
	purpose Purpose
	key     Key
	now     func() time.Time
}

// NewSigner returns a Signer for purpose p with key k.
func NewSigner(p Purpose, k Key) *Signer {
	return &Signer{purpose: p, key: k, now: time.Now}
}

// Sign fills iss, aud, sub, iat, nbf, exp and jti from the arguments and the
// clock, sets the purpose, and returns the compact token. c's Tenant and Env
// must be set.
func (s *Signer) Sign(c Claims, ttl time.Duration) (string, error) {
	if c.Tenant == "" || c.Env == "" {
		return "", fmt.Errorf("sign %s token: %w: tenant and env", s.purpose, ErrMissingClaim)
	}
	now := s.now().Truncate(time.Second)
	c.Purpose = s.purpose
	c.Issuer = Issuer
	c.Subject = Subject(c.Tenant, c.Env)
	c.Audience = jwt.ClaimStrings{Audience(s.purpose, c.Tenant, c.Env)}
	c.IssuedAt = jwt.NewNumericDate(now)
	if c.NotBefore == nil {
		c.NotBefore = jwt.NewNumericDate(now)
	}
	c.ExpiresAt = jwt.NewNumericDate(now.Add(ttl))
	if c.ID == "" {
		c.ID = NewID()
	}
	t := jwt.NewWithClaims(jwt.SigningMethodHS256, c)
	t.Header["kid"] = s.key.ID
	return t.SignedString(s.key.Secret)
}

// NewID returns a random 128-bit token id, hex encoded.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms.
	return hex.EncodeToString(b[:])
}

// Verifier checks tokens of one purpose.
type Verifier struct {
	purpose Purpose
	keys    []Key
	skew    time.Duration
	now     func() time.Time
	// tenant and env, when set, are the only subject accepted (a worker's
	// verifier of request tokens).
	tenant, env string
}

// NewVerifier returns a Verifier accepting purpose p signed by any of keys
// (several during a key rotation).
func NewVerifier(p Purpose, keys ...Key) *Verifier {
	return &Verifier{purpose: p, keys: keys, skew: DefaultClockSkew, now: time.Now}
}

// ForSubject restricts v to tokens bound to (tenant, env) and returns v.
func (v *Verifier) ForSubject(tenant, env string) *Verifier {
	v.tenant, v.env = tenant, env
	return v
}

// maxTokenLen bounds the input to the parser: real tokens are under 1 KB.
const maxTokenLen = 4096

// Verify parses tok, checks alg (HS256 only), key id, signature (constant
// time), issuer, purpose, audience, subject, expiry and not-before (with a few
// seconds of clock skew), and returns its claims. Errors wrap one of the
// package's sentinel errors.
func (v *Verifier) Verify(tok string) (*Claims, error) {
	if tok == "" || len(tok) > maxTokenLen {
		return nil, fmt.Errorf("verify %s token: %w: length %d", v.purpose, ErrMalformed, len(tok))
	}
	var c Claims
	parser := jwt.NewParser(
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithoutClaimsValidation(), // checked below, with our own errors and clock
		jwt.WithStrictDecoding(),
	)
	_, err := parser.ParseWithClaims(tok, &c, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		for _, k := range v.keys {
			if subtle.ConstantTimeCompare([]byte(k.ID), []byte(kid)) == 1 {
				return k.Secret, nil
			}
		}
		return nil, ErrUnknownKey
	})
	switch {
	case err == nil:
	case errors.Is(err, ErrUnknownKey):
		return nil, fmt.Errorf("verify %s token: %w", v.purpose, ErrUnknownKey)
	case errors.Is(err, jwt.ErrSignatureInvalid), errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return nil, fmt.Errorf("verify %s token: %w", v.purpose, ErrSignature)
	default:
		return nil, fmt.Errorf("verify %s token: %w: %v", v.purpose, ErrMalformed, err)
	}
	if err := v.checkClaims(&c); err != nil {
		return nil, fmt.Errorf("verify %s token: %w", v.purpose, err)
	}
	return &c, nil
}

func (v *Verifier) checkClaims(c *Claims) error {
	if c.Issuer != Issuer {
		return fmt.Errorf("%w: issuer %q", ErrAudience, c.Issuer)
	}
	if c.Purpose != v.purpose {
		return fmt.Errorf("%w: got %q", ErrPurpose, c.Purpose)
	}
	if c.Tenant == "" || c.Env == "" || c.ID == "" || c.ExpiresAt == nil || c.NotBefore == nil {
		return ErrMissingClaim
	}
	if c.Subject != Subject(c.Tenant, c.Env) {
		return fmt.Errorf("%w: sub %q", ErrSubject, c.Subject)
	}
	if v.tenant != "" && (c.Tenant != v.tenant || c.Env != v.env) {
		return fmt.Errorf("%w: token for %s", ErrSubject, c.Subject)
	}
	want := Audience(v.purpose, c.Tenant, c.Env)
	if v.tenant != "" {
		want = Audience(v.purpose, v.tenant, v.env)
	}
	if len(c.Audience) != 1 || c.Audience[0] != want {
		return fmt.Errorf("%w: got %v, want %q", ErrAudience, []string(c.Audience), want)
	}
	now := v.now()
	if !now.Before(c.ExpiresAt.Add(v.skew)) {
		return fmt.Errorf("%w: at %s", ErrExpired, c.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if now.Add(v.skew).Before(c.NotBefore.Time) {
		return fmt.Errorf("%w: until %s", ErrNotYetValid, c.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// Fingerprint returns a short, non-reversible tag of a token for logs
// (the first 12 hex digits of its SHA-256). Never log a token itself.
func Fingerprint(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:6])
}
