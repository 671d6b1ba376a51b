package worker

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/localproxy"
)

// ExitIdentity is the exit status of a worker whose identity token was
// revoked, expired or refused by the mint with no successor written to
// TALKIDE_WORKER_IDENTITY_TOKEN_FILE within TALKIDE_IDENTITY_FAILURE_GRACE
// (sysexits' EX_NOPERM). Started again with the same token it would fail
// the same way once it mints; it needs a new token in its Secret.
const ExitIdentity = contract.ExitIdentity

// IdentityError is Run's error when the worker stopped because its identity
// token can no longer mint (cmd/talkide-worker exits with ExitIdentity).
type IdentityError struct {
	Failure localproxy.IdentityFailure
	// Grace is how long the worker waited for a successor.
	Grace time.Duration
}

func (e *IdentityError) Error() string {
	return fmt.Sprintf("%v; no new identity token within %s", &e.Failure, e.Grace)
}

// identityState is what /readyz says while the identity token is failing.
type identityState struct {
	failure localproxy.IdentityFailure
	exitAt  time.Time
}

// watchIdentity follows id until ctx ends. When id records a failure it
// logs it, turns /readyz of api to 503 with the reason, and returns an
// *IdentityError once grace has passed without the failure being cleared (a
// new token in the file, or the mint accepting the token again); a cleared
// failure turns /readyz back. While a failure lasts the file is looked at
// every IdentityRecheck; otherwise the watcher sleeps until the token's exp
// or a change.
func watchIdentity(ctx context.Context, id *localproxy.Identity, grace time.Duration, api *Server, log *slog.Logger) error {
	var deadline *time.Timer
	var deadlineC <-chan time.Time
	var failed *localproxy.IdentityFailure
	defer func() {
		if deadline != nil {
			deadline.Stop()
		}
	}()
	for {
		f := id.Failure()
		if failed != nil && (f == nil || f.Fingerprint != failed.Fingerprint) {
			// A new token was taken (or the mint accepts the old one
			// again): whatever happens to it starts afresh.
			log.Info("identity token failure cleared; the worker is ready again", "failed_token", failed.Fingerprint, "failed_jti", failed.JTI)
			api.identityFailure.Store(nil)
			deadline.Stop()
			deadline, deadlineC, failed = nil, nil, nil
		}
		switch {
		case f != nil && failed == nil:
			exitAt := time.Now().Add(grace)
			log.Error("identity token can no longer mint; the worker is unready and exits unless a new token appears",
				"reason", f.Reason, "token", f.Fingerprint, "jti", f.JTI, "mint_message", f.Msg, "grace", grace.String(), "exit_at", exitAt.UTC().Format(time.RFC3339))
			api.identityFailure.Store(&identityState{failure: *f, exitAt: exitAt})
			deadline = time.NewTimer(grace)
			deadlineC = deadline.C
		case f != nil && f.Reason != failed.Reason: // e.g. expired, then the mint says revoked
			api.identityFailure.Store(&identityState{failure: *f, exitAt: api.identityFailure.Load().exitAt})
		}
		failed = f
		var wake <-chan time.Time
		if f != nil {
			wake = time.After(localproxy.IdentityRecheck)
		} else if exp := id.Expiry(); !exp.IsZero() {
			wake = time.After(time.Until(exp))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-id.Changed():
		case <-wake:
			id.Refresh()
		case <-deadlineC:
			return &IdentityError{Failure: *failed, Grace: grace}
		}
	}
}

// identityReadiness is the 503 body of /readyz while the identity token is
// failing (docs/worker-api.md §4.7).
type identityReadiness struct {
	Status string `json:"status"` // "not ready"
	// Reason is "identity_token_" followed by IdentityFailure.Reason
	// (revoked, expired or refused).
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// TokenFingerprint and JTI name the failing token.
	TokenFingerprint string `json:"token_fingerprint"`
	JTI              string `json:"jti"`
	// Since is when the failure was found; ExitAt when the worker exits
	// with ExitIdentity unless a new token appears first.
	Since  time.Time `json:"since"`
	ExitAt time.Time `json:"exit_at"`
}

func (st *identityState) readiness() identityReadiness {
	f := st.failure
	return identityReadiness{
		Status:           "not ready",
		Reason:           "identity_token_" + f.Reason,
		Message:          fmt.Sprintf("%v; the worker exits with status %d at exit_at unless a new identity token appears", &f, ExitIdentity),
		TokenFingerprint: f.Fingerprint,
		JTI:              f.JTI,
		Since:            f.Since.UTC(),
		ExitAt:           st.exitAt.UTC(),
	}
}
