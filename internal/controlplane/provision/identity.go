package provision

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/token"
)

// ensureSecret makes the Secret talkide-worker-token hold a valid identity
// token of the tenant-env and its request keys, rotating the token when it
// is within Config.RotateBefore of expiry (or forceRotate): the new token is
// written first, the old one retires after Config.Grace. The Secret is
// written with its resourceVersion, so of two control planes rotating at
// once one wins and the other revokes the token it minted. It then revokes
// retired and orphaned tokens. It returns the hash of the request keys (for
// the pod template) and when the tokens next need the provisioner
// (retireTokens).
func (p *K8sWorkerProvisioner) ensureSecret(ctx context.Context, tenant, env string, forceRotate bool) (string, time.Time, error) {
	ns := Namespace(tenant, env)
	reqKeys := p.requestKeys(tenant, env)
	secrets := p.kube.CoreV1().Secrets(ns)
	var current string
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			return "", time.Time{}, &Error{Reason: ReasonAPIError, Message: "Secret " + SecretName + " keeps changing under the provisioner (another control plane rotating?)"}
		}
		sec, err := secrets.Get(ctx, SecretName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			tok, jti, err := p.issue(ctx, tenant, env)
			if err != nil {
				return "", time.Time{}, err
			}
			if err := p.step(ctx, tenant, env, "identity-issued"); err != nil {
				return "", time.Time{}, err
			}
			_, err = secrets.Create(ctx, secretObject(&p.cfg, tenant, env, tok, reqKeys), metav1.CreateOptions{FieldManager: FieldManager})
			if err != nil {
				p.revoke(ctx, jti, "Secret not written")
				if apierrors.IsAlreadyExists(err) {
					continue
				}
				return "", time.Time{}, apiError("create Secret "+SecretName, err)
			}
			p.cfg.Logger.Info("identity token issued", "tenant", tenant, "env", env, "jti", jti)
			current = jti
			// A Secret deleted behind the provisioner's back: the token
			// it held is still mounted in the running pods, so it gets
			// the grace a rotation gives, not an orphan's end.
			if rec, err := p.store.WorkerRecord(ctx, tenant, env); err == nil && rec.IdentityJTI != "" && rec.IdentityJTI != jti {
				if err := p.store.RetireIdentityToken(ctx, rec.IdentityJTI, p.now().Add(p.cfg.Grace)); err == nil {
					p.cfg.Logger.Info("identity token retiring (its Secret was deleted)", "tenant", tenant, "env", env, "jti", rec.IdentityJTI)
				}
			}
			break
		}
		if err != nil {
			return "", time.Time{}, apiError("read Secret "+SecretName, err)
		}
		old := string(sec.Data[SecretKeyID])
		oldClaims, why := p.usable(ctx, tenant, env, old)
		rotate := forceRotate || why != ""
		if rotate || !bytes.Equal(sec.Data[SecretKeyReq], []byte(reqKeys)) || !p.cfg.ownedBy(sec.Labels, tenant, env) {
			want := secretObject(&p.cfg, tenant, env, old, reqKeys)
			want.ResourceVersion = sec.ResourceVersion
			var jti string
			if rotate {
				var tok string
				if tok, jti, err = p.issue(ctx, tenant, env); err != nil {
					return "", time.Time{}, err
				}
				want.Data[SecretKeyID] = []byte(tok)
			}
			if _, err := secrets.Update(ctx, want, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
				if jti != "" {
					p.revoke(ctx, jti, "Secret not written")
				}
				if apierrors.IsConflict(err) {
					continue
				}
				return "", time.Time{}, apiError("update Secret "+SecretName, err)
			}
			if !rotate {
				current = oldClaims.ID
				break
			}
			current = jti
			if oldClaims != nil {
				// The old token stays valid for the grace (never past
				// its own expiry), for every pod to read the new one.
				end := p.now().Add(p.cfg.Grace)
				if exp := oldClaims.ExpiresAt.Time; exp.Before(end) {
					end = exp
				}
				if err := p.store.RetireIdentityToken(ctx, oldClaims.ID, end); err != nil && !errors.Is(err, controlstore.ErrNotFound) {
					return "", time.Time{}, err
				}
				p.cfg.Logger.Info("identity token rotated", "tenant", tenant, "env", env, "jti", jti, "previous", oldClaims.ID, "previous_valid_until", end, "forced", forceRotate)
			} else {
				p.cfg.Logger.Info("identity token replaced", "tenant", tenant, "env", env, "jti", jti, "reason", why)
			}
			break
		}
		current = oldClaims.ID
		break
	}
	if err := p.store.SetWorkerIdentity(ctx, tenant, env, current); err != nil && !errors.Is(err, controlstore.ErrNotFound) {
		return "", time.Time{}, err
	}
	due, err := p.retireTokens(ctx, tenant, env, current)
	if err != nil {
		return "", time.Time{}, err
	}
	return hash(reqKeys), due, nil
}

// usable checks the identity token in the Secret. It returns its claims
// when it verifies for this tenant-env and is recorded and unrevoked (nil
// otherwise), and why it must be replaced ("" when it may stay).
func (p *K8sWorkerProvisioner) usable(ctx context.Context, tenant, env, tok string) (*token.Claims, string) {
	c, err := p.verifyIdentity(tok, tenant, env)
	if err != nil {
		return nil, "the Secret's identity token does not verify: " + err.Error()
	}
	rec, err := p.store.IdentityTokenByID(ctx, c.ID)
	if err != nil {
		return nil, "the Secret's identity token is not recorded: " + err.Error()
	}
	if rec.RevokedAt != nil {
		return nil, "the Secret's identity token is revoked"
	}
	if rec.RetireAt != nil {
		return c, "the Secret's identity token is retiring"
	}
	if c.ExpiresAt.Sub(p.now()) < p.cfg.RotateBefore {
		return c, fmt.Sprintf("the identity token expires at %s, within %s", c.ExpiresAt.UTC().Format(time.RFC3339), p.cfg.RotateBefore)
	}
	return c, ""
}

func (p *K8sWorkerProvisioner) issue(ctx context.Context, tenant, env string) (tok, jti string, err error) {
	tok, err = p.issuer.IssueIdentity(ctx, tenant, env, p.cfg.IdentityTTL)
	if err != nil {
		return "", "", fmt.Errorf("issue identity token: %w", err)
	}
	c, err := p.verifyIdentity(tok, tenant, env)
	if err != nil {
		return "", "", fmt.Errorf("issue identity token: %w", err)
	}
	return tok, c.ID, nil
}

func (p *K8sWorkerProvisioner) revoke(ctx context.Context, jti, why string) {
	if err := p.store.RevokeIdentityToken(context.WithoutCancel(ctx), jti, p.now()); err != nil && !errors.Is(err, controlstore.ErrNotFound) {
		p.cfg.Logger.Error("revoke identity token (the resync retries it)", "jti", jti, "why", why, "err", err)
		return
	}
	p.cfg.Logger.Info("identity token revoked", "jti", jti, "why", why)
}

// retireTokens revokes the tenant-env's tokens other than current whose
// grace is over, and orphans. It returns when its tokens next need the
// provisioner (zero: never before they expire): the current one's
// rotation, a retiring one's end of grace, an orphan's revocation.
func (p *K8sWorkerProvisioner) retireTokens(ctx context.Context, tenant, env, current string) (time.Time, error) {
	toks, err := p.store.LiveIdentityTokens(ctx, tenant, env)
	if err != nil {
		return time.Time{}, err
	}
	now := p.now()
	var next time.Time
	due := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for _, t := range toks {
		switch {
		case t.JTI == current:
			due(t.ExpiresAt.Add(-p.cfg.RotateBefore))
		case t.RetireAt != nil && !t.RetireAt.After(now):
			p.revoke(ctx, t.JTI, "grace period over")
		case !t.ExpiresAt.After(now):
			p.revoke(ctx, t.JTI, "expired")
		case t.RetireAt == nil && now.Sub(t.IssuedAt) > p.orphanAge:
			p.revoke(ctx, t.JTI, "not in the worker's Secret")
		case t.RetireAt != nil:
			due(*t.RetireAt)
		default:
			due(t.IssuedAt.Add(p.orphanAge))
		}
	}
	return next, nil
}

// revokeAll revokes every live identity token of the tenant-env.
func (p *K8sWorkerProvisioner) revokeAll(ctx context.Context, tenant, env string) error {
	toks, err := p.store.LiveIdentityTokens(ctx, tenant, env)
	if err != nil {
		return err
	}
	for _, t := range toks {
		if err := p.store.RevokeIdentityToken(ctx, t.JTI, p.now()); err != nil && !errors.Is(err, controlstore.ErrNotFound) {
			return err
		}
		p.cfg.Logger.Info("identity token revoked", "jti", t.JTI, "why", "deprovisioned", "tenant", tenant, "env", env)
	}
	return nil
}
