// Package mint is the control plane's mint endpoint
// (POST /api/v1/worker-gateway/token/mint): a worker presents its identity
// token and a conversation id, and gets a WorkerToken (TTL 120 s) scoped to
// that conversation, its tenant-env and its user.
//
// It also issues identity tokens (IssueIdentity) for provisioning and for the
// one-machine run. It does not proxy model calls (package gateway does).
package mint

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/token"
)

// Store is what the mint needs from the control-plane database.
type Store interface {
	Conversation(ctx context.Context, id string) (controlstore.Conversation, error)
	IdentityTokenByID(ctx context.Context, jti string) (controlstore.IdentityToken, error)
	RecordIdentityToken(ctx context.Context, t controlstore.IdentityToken) error
}

var _ Store = (*controlstore.DB)(nil)

// Handler serves the mint endpoint.
type Handler struct {
	store    Store
	identity *token.Verifier
	idSigner *token.Signer
	signer   *token.Signer
	log      *slog.Logger
}

// New returns the mint over store. It signs with keys derived from master
// and accepts identity tokens signed with master or any of older (master
// keys being rotated out, so existing workers keep minting).
func New(store Store, master token.MasterKey, log *slog.Logger, older ...token.MasterKey) *Handler {
	idKeys := []token.Key{master.Derive(token.PurposeIdentity, "", "")}
	for _, o := range older {
		idKeys = append(idKeys, o.Derive(token.PurposeIdentity, "", ""))
	}
	return &Handler{
		store:    store,
		identity: token.NewVerifier(token.PurposeIdentity, idKeys...),
		idSigner: token.NewSigner(token.PurposeIdentity, master.Derive(token.PurposeIdentity, "", "")),
		signer:   token.NewSigner(token.PurposeGateway, master.Derive(token.PurposeGateway, "", "")),
		log:      log,
	}
}

// IssueIdentity signs an identity token for (tenant, env) valid for ttl
// (token.IdentityTTL when zero) and records its id, so the mint accepts it
// until it expires or is revoked.
func (h *Handler) IssueIdentity(ctx context.Context, tenant, env string, ttl time.Duration) (string, error) {
	if ttl <= 0 {
		ttl = token.IdentityTTL
	}
	c := token.Claims{Tenant: tenant, Env: env}
	c.ID = token.NewID()
	tok, err := h.idSigner.Sign(c, ttl)
	if err != nil {
		return "", err
	}
	now := time.Now()
	if err := h.store.RecordIdentityToken(ctx, controlstore.IdentityToken{
		JTI: c.ID, Tenant: tenant, Env: env, IssuedAt: now, ExpiresAt: now.Add(ttl),
	}); err != nil {
		return "", err
	}
	return tok, nil
}

// ServeHTTP mints a WorkerToken. Errors: 401 for a missing, forged, expired,
// unknown, revoked or retired (past its grace after a rotation) identity
// token; 403 when the conversation does not exist
// or belongs to another tenant-env (the two are not told apart); 400 for a
// malformed body.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	httpapi.Handle(h.log, h.mint).ServeHTTP(w, r)
}

func (h *Handler) mint(w http.ResponseWriter, r *http.Request) error {
	raw := httpapi.BearerToken(r)
	if raw == "" {
		return httpapi.Unauthorized("missing identity token (Authorization: Bearer)", nil)
	}
	id, err := h.identity.Verify(raw)
	if err != nil {
		// A warning (a forged or stale credential is worth an alert); the
		// cause is on the request's error line.
		h.log.WarnContext(r.Context(), "mint refused identity token", "token", token.Fingerprint(raw))
		return httpapi.Unauthorized("invalid identity token", err)
	}
	rec, err := h.store.IdentityTokenByID(r.Context(), id.ID)
	if errors.Is(err, controlstore.ErrNotFound) {
		return httpapi.Unauthorized("identity token not issued by this control plane", err)
	}
	if err != nil {
		return err
	}
	if rec.RevokedAt != nil {
		return httpapi.Unauthorized("identity token revoked", nil)
	}
	if rec.RetireAt != nil && !time.Now().Before(*rec.RetireAt) {
		// Its grace after a rotation is over, whether or not a reconcile
		// of the tenant-env has revoked it yet.
		h.log.WarnContext(r.Context(), "mint refused retired identity token", "tenant", rec.Tenant, "env", rec.Env, "retired_at", rec.RetireAt)
		return httpapi.Unauthorized("identity token retired (replaced by a newer one; its grace ended)", nil)
	}
	// A worker's local proxy sends its model call's id: the call's lines
	// here and in the worker's log share it.
	httpapi.AdoptRequestID(w, r)
	body, err := httpapi.ReadBody(w, r, 4<<10)
	if err != nil {
		return err
	}
	var req contract.MintRequest
	if err := httpapi.DecodeJSON(r, body, &req); err != nil {
		return err
	}
	if err := contract.ValidConversationID(req.ConversationID); err != nil {
		return httpapi.BadRequest("%v", err)
	}
	conv, err := h.store.Conversation(r.Context(), req.ConversationID)
	if errors.Is(err, controlstore.ErrNotFound) || (err == nil && (conv.Tenant != id.Tenant || conv.Env != id.Env)) {
		h.log.WarnContext(r.Context(), "mint refused conversation outside the worker's tenant-env", "tenant", id.Tenant, "env", id.Env, "conversation", req.ConversationID)
		return httpapi.Forbidden("conversation not in this worker's tenant-env", err)
	}
	if err != nil {
		return err
	}
	tok, err := h.signer.Sign(token.Claims{Tenant: conv.Tenant, Env: conv.Env, Conversation: conv.ID, User: conv.UserID}, token.WorkerTokenTTL)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, contract.MintResponse{Token: tok, ExpiresAt: time.Now().Add(token.WorkerTokenTTL).UTC().Truncate(time.Second)})
	return nil
}
