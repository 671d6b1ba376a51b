package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/controlplane/budget"
)

// Metering: the answer streams back unchanged while a tee reads its
// usage; when it ends, the call is booked (postCallDebit) in the background.

func (h *Handler) modifyResponse(resp *http.Response) error {
	c := resp.Request.Context().Value(ctxKey{}).(*call)
	if resp.StatusCode == http.StatusUnauthorized {
		h.keyRefused(resp, c)
	} else if resp.StatusCode < 300 && h.refusal.Load() != nil {
		h.refusal.Store(nil)
	}
	h.m.observeUpstream(c.apiPath, time.Since(c.forwarded))
	h.m.request(c.apiPath, resp.StatusCode)
	hdr := resp.Header
	// Reverse proxies in front of the control plane must not buffer.
	hdr.Set("X-Accel-Buffering", "no")
	stream := strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream")
	if stream && hdr.Get("Cache-Control") == "" {
		hdr.Set("Cache-Control", "no-cache")
	}
	hdr.Set(HeaderOverhead, strconv.FormatFloat(float64(c.forwarded.Sub(c.start).Microseconds())/1000, 'f', 3, 64))
	if !stream {
		nameRequest(resp, c.requestID)
	}
	if c.ticket == nil {
		return nil // not metered: count_tokens is free
	}
	m := &meteredBody{rc: resp.Body, h: h, c: c, status: resp.StatusCode, requestID: hdr.Get("Request-Id")}
	var sink io.Writer = &m.buf
	if stream {
		m.stream = &anthropic.StreamMeter{}
		sink = m.stream
	}
	m.tee = sink
	switch enc := strings.ToLower(strings.TrimSpace(hdr.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip", "deflate":
		m.decoder = newDecodeTee(enc, sink)
		m.tee = m.decoder
	default:
		m.undecodable = enc // passed through, charged at the reservation
	}
	if m.tee != sink || m.undecodable != "" {
		// Compressed: the meter is fed on another goroutine (or not at
		// all), so the call is treated as past message_start: a client
		// that leaves cancels it at once, as before.
		m.started.Store(true)
	}
	h.m.streams(1)
	resp.Body = m
	c.meter.Store(m)
	return nil
}

// settle books the call's cost in the background.
func (h *Handler) settle(c *call, u anthropic.Usage, cost budget.NanoUSD, outcome, requestID string) {
	h.background(func() { h.book(c, u, cost, outcome, requestID) })
}

// atReservation, as book's cost, books the call at its whole reservation.
const atReservation budget.NanoUSD = -1

// book waits for the call's reservation and replaces it with cost (the
// postCallDebit; atReservation: the reservation's amount), retrying a
// failed debit twice.
func (h *Handler) book(c *call, u anthropic.Usage, cost budget.NanoUSD, outcome, requestID string) {
	c.release()
	if requestID == "" {
		requestID = c.requestID
	}
	res, err := c.ticket.Result()
	if err != nil {
		return // refused or failed: nothing was reserved
	}
	if cost == atReservation {
		cost = res.Amount
	}
	d := budget.Debit{ConversationID: c.claims.Conversation, RequestID: requestID, Outcome: outcome, Usage: u}
	for attempt := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = h.cfg.Budget.PostCallDebit(ctx, res, cost, d)
		cancel()
		if err == nil || errors.Is(err, budget.ErrClosed) {
			break
		}
		time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
	}
	model := "other"
	if _, known := h.cfg.Prices.Lookup(u.Model, c.start); known {
		model = u.Model
	}
	h.m.settled(model, u, cost, outcome, err)
	if err != nil {
		// The reservation stays open and is charged in full when it
		// expires: the debit is not lost, only overstated.
		h.log.Error("post-call debit failed", "tenant", c.claims.Tenant, "conversation", c.claims.Conversation, "user", c.claims.User,
			"request_id", requestID, "cost_nano_usd", cost, "outcome", outcome, "err", err)
		return
	}
	h.log.Debug("call settled", "tenant", c.claims.Tenant, "env", c.claims.Env, "conversation", c.claims.Conversation, "user", c.claims.User,
		"request_id", requestID, "model", u.Model, "outcome", outcome, "input_tokens", u.InputTokens, "output_tokens", u.OutputTokens,
		"cache_write_tokens", u.CacheCreationInputTokens, "cache_read_tokens", u.CacheReadInputTokens,
		"cost_nano_usd", cost, "duration_ms", time.Since(c.start).Milliseconds())
}

// maxJSONMeter bounds the copy of a non-streaming answer kept to read its
// usage; Messages answers are far smaller.
const maxJSONMeter = 8 << 20

// meteredBody passes the upstream body through unchanged while reading usage
// from a copy, and settles the call once, when the body ends or is closed.
type meteredBody struct {
	rc        io.ReadCloser
	h         *Handler
	c         *call
	status    int
	requestID string
	stream    *anthropic.StreamMeter // nil: a JSON answer, kept in buf
	buf       limitedBuffer
	tee       io.Writer  // where read bytes are copied: the meter, buf or decoder
	decoder   *decodeTee // set when the upstream compressed the answer
	received  int64      // bytes read from the upstream
	readErr   error      // the first read error other than EOF
	eof       bool       // the upstream's answer ended
	once      sync.Once
	// undecodable is a Content-Encoding the tee cannot read.
	undecodable string
	// started is set once a stream's message_start was read.
	started atomic.Bool
	// drained is set when the answer was read on after the client left.
	drained bool
}

func (m *meteredBody) Read(p []byte) (int, error) {
	n, err := m.rc.Read(p)
	if n > 0 {
		m.received += int64(n)
		m.tee.Write(p[:n])
		if m.stream != nil && !m.started.Load() && m.stream.Started() { // an uncompressed stream: the meter is ours
			m.started.Store(true)
			if m.c.gone.Load() {
				// The client left before message_start: the input-side
				// usage is known now, and the output nobody reads is
				// not worth paying for.
				m.c.cancelUp()
			}
		}
	}
	if err == io.EOF {
		m.eof = true // settled at Close, after the last bytes reached the client
	} else if err != nil && m.readErr == nil {
		m.readErr = err
	}
	return n, err
}

// Close settles the call; the reverse proxy closes the body once it has
// relayed (and flushed) all of it, or given up.
func (m *meteredBody) Close() error {
	if !m.eof && m.readErr == nil && !m.started.Load() {
		// The relay stopped before the usage was known: the client is
		// gone. Read on for it, bounded (clientgone.go).
		m.c.gone.Store(true)
		m.h.background(m.drain)
		return nil
	}
	err := m.rc.Close()
	m.finish(m.eof)
	return err
}

// finish settles the call once, in the background: working out the cost
// (parsing a JSON answer's usage, say) is no reason to keep the client
// waiting.
func (m *meteredBody) finish(eof bool) {
	m.once.Do(func() {
		m.h.m.streams(-1)
		clientGone := m.c.client.Err() != nil
		m.h.background(func() { m.settle(eof, clientGone) })
	})
}

// settle works out what the call cost and books it.
func (m *meteredBody) settle(eof, clientGone bool) {
	h, c := m.h, m.c
	var decodeErr error
	if m.decoder != nil {
		decodeErr = m.decoder.finish()
	}
	var u anthropic.Usage
	// final: the usage that settles the call came and was read (a JSON
	// answer's is its only one).
	final := true
	if m.stream != nil {
		u, final = m.stream.Ended()
	} else if m.buf.overflow {
		u.Unreadable = fmt.Sprintf("the answer is over %d bytes, more than the meter keeps", maxJSONMeter)
	} else if m.received > 0 {
		u, _ = anthropic.ParseMessageUsage(m.buf.Bytes())
	}
	if u.Model == "" {
		u.Model = c.model
	}
	complete := u.Finished && final
	outcome := "complete"
	switch {
	case m.status != http.StatusOK:
		// Anthropic does not bill calls that fail with an error status.
		h.book(c, u, 0, "http_error", m.requestID)
		return
	case m.undecodable != "" || (!u.Started && u.ErrorType == "" && u.Unreadable == "" && m.received > 0):
		// Bytes came back that the tee could not read: charge the
		// reservation, never nothing.
		h.log.Warn("answer not metered: charging the reservation", "request_id", c.requestID, "content_encoding", m.undecodable,
			"decode_err", decodeErr, "received_bytes", m.received)
		h.book(c, u, atReservation, "unmetered", m.requestID)
		return
	case u.Unreadable != "":
		// The usage that settles the call came but cannot be read: the
		// figures read before it (message_start's one output token)
		// are not what the call cost.
		m.unreadable(u, u.Unreadable)
		return
	case !u.Started && u.ErrorType != "":
		h.book(c, u, 0, "stream_error", m.requestID)
		return
	case !u.Started:
		// The upstream took the call and sent no usage (it cut the
		// answer, or the client left and the wait ran out): it may bill
		// at least the input.
		h.book(c, u, c.floor, "no_usage", m.requestID)
		return
	case u.ErrorType != "":
		outcome = "stream_error"
	case clientGone || m.drained:
		outcome = "client_disconnect"
	case complete:
	case !final && u.Finished:
		m.unreadable(u, "message_stop without a message_delta usage")
		return
	case !final && eof && m.readErr == nil:
		m.unreadable(u, "the stream ended without message_delta or message_stop")
		return
	case m.readErr != nil || !eof:
		outcome = "upstream_cut"
	default:
		outcome = "incomplete"
	}
	billed := u
	billed.OutputTokens = u.BilledOutputTokens(complete)
	price, _ := h.cfg.Prices.PriceFor(u.Model, c.start)
	h.book(c, billed, price.Cost(billed), outcome, m.requestID)
}

// unreadable books a call whose settling usage could not be read (why) at
// its reservation, outcome unmetered, with a warning naming the call.
func (m *meteredBody) unreadable(u anthropic.Usage, why string) {
	h, c := m.h, m.c
	h.log.Warn("usage unreadable: charging the reservation", "tenant", c.claims.Tenant, "env", c.claims.Env,
		"conversation", c.claims.Conversation, "user", c.claims.User, "request_id", c.requestID,
		"upstream_request_id", m.requestID, "model", u.Model, "reason", why, "received_bytes", m.received)
	h.book(c, u, atReservation, "unmetered", m.requestID)
}

// limitedBuffer keeps the first maxJSONMeter bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	overflow bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > maxJSONMeter {
		b.overflow = true
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// drain reads the rest of an answer whose client is gone, until its usage
// is known (a stream's message_start; the end of a JSON answer) or the
// bound ends the upstream call, then settles the call.
func (m *meteredBody) drain() {
	m.h.bound(m.c)
	m.drained = true
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	for !m.started.Load() {
		if _, err := m.Read(*buf); err != nil {
			break
		}
	}
	m.c.cancelUp()
	m.rc.Close()
	m.once.Do(func() {
		m.h.m.streams(-1)
		m.settle(m.eof, true)
	})
}
