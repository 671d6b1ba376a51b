package controlplane

import (
	"context"
	"sync"
	"time"
)

// upstreamCheckEvery is how long one check of the model upstream stands for
// readiness: probes in between get its result, so a busy probe schedule
// costs at most one request to the upstream per interval.
const upstreamCheckEvery = 10 * time.Second

// upstreamCheckTimeout bounds one check.
const upstreamCheckTimeout = 5 * time.Second

// upstreamCheck remembers the last check of the model upstream (see
// gateway.Handler.CheckUpstream) for readiness.
type upstreamCheck struct {
	check func(context.Context) error

	// mu guards at and err, and is held during a check, so concurrent
	// probes wait for one check instead of each making their own.
	mu  sync.Mutex
	at  time.Time
	err error
}

// result returns the last check's result, checking again when it is older
// than upstreamCheckEvery. The error (a *gateway.UpstreamError) names the
// upstream and the cause.
func (u *upstreamCheck) result(ctx context.Context) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.at.IsZero() && time.Since(u.at) < upstreamCheckEvery {
		return u.err
	}
	ctx, cancel := context.WithTimeout(ctx, upstreamCheckTimeout)
	defer cancel()
	u.err = u.check(ctx)
	u.at = time.Now()
	return u.err
}
