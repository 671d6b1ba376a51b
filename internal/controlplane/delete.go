package controlplane

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/workerclient"
	"github.com/talkide/talkide/internal/httpapi"
)

// This file holds the conversation quotas and DELETE /api/conversations/{id}.

// storeConversation stores a new conversation within the quotas
// (Config.MaxConversationsPerUser, MaxConversationsPerTenantEnv); one over
// them is 429 rate_limited naming the setting.
func (s *Server) storeConversation(ctx context.Context, c controlstore.Conversation) error {
	err := s.db.CreateConversationCapped(ctx, c, controlstore.ConversationCaps{
		PerUser: s.cfg.MaxConversationsPerUser, PerTenantEnv: s.cfg.MaxConversationsPerTenantEnv})
	var qe *controlstore.QuotaError
	switch {
	case errors.As(err, &qe) && qe.Scope == "user":
		return httpapi.Errorf(http.StatusTooManyRequests, contract.ErrTypeRateLimited,
			"you have %d conversations in %s/%s, the most allowed (TALKIDE_MAX_CONVERSATIONS_PER_USER); delete one first", qe.Count, c.Tenant, c.Env)
	case errors.As(err, &qe):
		return httpapi.Errorf(http.StatusTooManyRequests, contract.ErrTypeRateLimited,
			"%s/%s has %d conversations, the most allowed (TALKIDE_MAX_CONVERSATIONS_PER_TENANT_ENV); delete one first", c.Tenant, c.Env, qe.Count)
	}
	return err
}

// notCreatedOnWorker handles a failed creation of c's session on its
// worker (err != nil), so that a 201 always means the worker has the
// session and nothing stays half-made otherwise: the conversation is undone
// here, and when the outcome on the worker is unknown (no answer, or a
// failure other than a refusal) the session is deleted on the worker too,
// which may have stored it before failing or before its answer was lost.
// A refusal (429: its caps or no agent uid free; 503: not taking new work,
// out of open files, disk or memory) is given before the session is made.
// The answer is the worker's: 429, 503 with Retry-After, or 502.
// The cause, err, is logged once, on the request's error line.
func (s *Server) notCreatedOnWorker(rctx context.Context, c controlstore.Conversation, wc *workerclient.Client, err error) error {
	// Not cancelled with the request: the undo must happen even if the
	// client has gone. Its lines carry the request's id.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(rctx), 5*time.Second)
	defer cancel()
	var we *workerclient.Error
	refused := errors.As(err, &we) && (we.Status == http.StatusTooManyRequests || we.Status == http.StatusServiceUnavailable)
	if wc != nil && !refused {
		if _, derr := wc.DeleteSession(ctx, c.ID); derr != nil && !(errors.As(derr, &we) && we.Status == http.StatusNotFound) {
			s.log.WarnContext(ctx, "remove a session the worker may have half-created", "conversation", c.ID, "tenant", c.Tenant, "env", c.Env, "err", derr)
		}
	}
	if derr := s.db.DeleteConversation(ctx, c.ID, time.Now()); derr != nil {
		s.log.ErrorContext(ctx, "undo a conversation the worker did not create", "conversation", c.ID, "err", derr)
	}
	return workerError(err)
}

// deleteConversation ends the user's conversation: the worker stops its
// agent and removes everything it keeps of it (see docs/browser-api.md for
// the retention rule), then the conversation is marked deleted here: it is
// 404 from then on and no longer counts for the quotas. The control plane
// keeps its records (activity, tool calls, usage, ledger). When the worker
// cannot be reached the answer is 503 and nothing is deleted: retry.
func (s *Server) deleteConversation(w http.ResponseWriter, r *http.Request) error {
	_, c, wc, err := s.ownConversation(r)
	if err != nil {
		return err
	}
	err = retryUnavailable(r.Context(), func(ctx context.Context) error {
		_, err := wc.DeleteSession(ctx, c.ID)
		return err
	})
	var we *workerclient.Error
	if err != nil && !(errors.As(err, &we) && we.Status == http.StatusNotFound) {
		return workerError(err)
	}
	if err := s.db.DeleteConversation(context.WithoutCancel(r.Context()), c.ID, time.Now()); err != nil && !errors.Is(err, controlstore.ErrNotFound) {
		return err
	}
	s.log.InfoContext(r.Context(), "conversation deleted", "conversation", c.ID, "tenant", c.Tenant, "env", c.Env, "user", c.UserID)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// deletedMeanwhile reports whether a worker's refusal err to reconnect a
// browser stream of conversation id is because the conversation was
// deleted since (404 from the worker, and no live conversation here), so
// the relay stops instead of reconnecting for as long as the browser stays.
func (s *Server) deletedMeanwhile(ctx context.Context, id string, err error) bool {
	var we *workerclient.Error
	if !errors.As(err, &we) || we.Status != http.StatusNotFound {
		return false
	}
	_, lerr := s.db.Conversation(ctx, id)
	return errors.Is(lerr, controlstore.ErrNotFound)
}
