package gateway

import (
	"context"
	"io"
	"net/http/httptrace"
	"net/http/httputil"
	"time"
)

// Booking what may be billed when the client leaves.
//
// The upstream bills a call once it has taken the request, whether or not
// anyone reads the answer. Were the upstream call ended with the client's
// request, an agent (which holds the credential of its worker's local
// proxy) could send large prompts, leave before the usage came back, and
// keep those calls off the ledger. So a metered call runs upstream on a
// context of its own (detach), and when the client leaves:
//
//   - a stream whose message_start was read is cancelled at once and
//     booked for its input-side usage and the output delivered (the user
//     stopped the turn; reading on would pay for output nobody reads);
//   - any other call (a non-streaming call, a stream before message_start)
//     goes on: the gateway reads the answer on its own (drain) until the
//     usage is known (the end of a JSON answer, a stream's message_start)
//     and books it; at most for Config.ClientGoneWait, and no longer than
//     until Close. A call whose usage never comes (the wait ran out, the
//     upstream failed after taking the request) is booked at its
//     input-side worst case (call.floor); a call that never reached the
//     upstream (call.wrote unset) at zero.
//
// The wait is bounded in time, and each such call holds its reservation
// until it is booked, so the budget bounds how many a user can leave
// behind.

// detach gives a metered call's upstream request a context of its own:
// it keeps the incoming request's values, ends only through cancelUp, and
// records when the request was written (call.wrote). It starts watching
// for the client leaving.
func (h *Handler) detach(pr *httputil.ProxyRequest, c *call) {
	c.up, c.cancelUp = context.WithCancel(context.WithoutCancel(pr.In.Context()))
	c.up = httptrace.WithClientTrace(c.up, &httptrace.ClientTrace{
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			if i.Err == nil {
				c.wrote.Store(true)
			}
		},
	})
	pr.Out = pr.Out.WithContext(c.up)
	c.unwatch = context.AfterFunc(c.client, func() { h.clientLeft(c) })
}

// clientLeft applies the rules above when c's client goes away.
func (h *Handler) clientLeft(c *call) {
	if m := c.meter.Load(); m != nil && m.started.Load() {
		c.cancelUp() // a stream past message_start: stop paying for output
		return
	}
	c.gone.Store(true)
	if m := c.meter.Load(); m != nil && m.started.Load() {
		c.cancelUp() // message_start came meanwhile (Read saw gone unset)
		return
	}
	h.bound(c)
}

// bound limits how long c's upstream call goes on without its client: until
// Config.ClientGoneWait has passed or Close begins.
func (h *Handler) bound(c *call) {
	c.goneOnce.Do(func() {
		t := time.AfterFunc(h.cfg.ClientGoneWait, c.cancelUp)
		stop := context.AfterFunc(h.stopping, c.cancelUp)
		c.disarm = func() { t.Stop(); stop() }
	})
}

// release ends what keeps c's upstream call going once c is booked.
func (c *call) release() {
	c.goneOnce.Do(func() {}) // no bound is armed after this
	if c.disarm != nil {
		c.disarm()
	}
	if c.cancelUp != nil {
		c.cancelUp()
	}
}

var _ io.ReadCloser = (*meteredBody)(nil)
