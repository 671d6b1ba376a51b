package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"sync"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
)

// Forwarding: the request the upstream gets (credentials replaced by the
// API key), the transport that holds a predicted call's answer until its
// reservation is durable, and the answer to a round trip that failed.

// bufferPool recycles the 32 KB copy buffers of relayed answers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }

// credentialHeaders never leave the gateway towards the upstream.
var credentialHeaders = []string{"Authorization", "X-Api-Key", "Cookie", "Proxy-Authorization", contract.HeaderWorkerToken}

func (h *Handler) rewrite(pr *httputil.ProxyRequest) {
	c := pr.In.Context().Value(ctxKey{}).(*call)
	pr.Out.URL = httpapi.JoinURL(h.cfg.Upstream, c.apiPath)
	pr.Out.URL.RawQuery = pr.In.URL.RawQuery
	pr.Out.Host = pr.Out.URL.Host
	for _, k := range credentialHeaders {
		pr.Out.Header.Del(k)
	}
	if h.cfg.APIKey != "" {
		pr.Out.Header.Set("X-Api-Key", h.cfg.APIKey)
	}
	// Ask for an uncompressed answer so the tee can read usage without
	// decoding; the bytes reach the worker exactly as the upstream sent
	// them either way.
	pr.Out.Header.Set("Accept-Encoding", "identity")
	if c.ticket != nil {
		// A metered call runs upstream on a context of its own, so a
		// client that leaves before its usage is known does not end it
		// (clientgone.go).
		h.detach(pr, c)
	}
	c.forwarded = time.Now()
	h.m.observeOverhead(c.forwarded.Sub(c.start))
}

func (h *Handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	c, _ := r.Context().Value(ctxKey{}).(*call)
	var late *lateRefusal
	if errors.As(err, &late) {
		// Refused after it was forwarded: the upstream call was cancelled
		// before any of its answer reached the client.
		h.refuse(w, r, c.apiPath, h.budgetRefusal(late.err, c.claims))
		return
	}
	if c != nil && c.ticket != nil {
		if c.wrote.Load() {
			// The upstream took the request and no usage came back (it
			// failed, or the client left and the wait ran out): it may
			// bill at least the input.
			h.settle(c, anthropic.Usage{Model: c.model}, c.floor, "no_usage", "")
		} else {
			// The request never reached the upstream: nothing to bill.
			h.settle(c, anthropic.Usage{Model: c.model}, 0, "no_answer", "")
		}
	}
	path := "other"
	reqID := ""
	var client context.Context = r.Context()
	if c != nil {
		path, reqID, client = c.apiPath, c.requestID, c.client
	}
	if client.Err() != nil {
		h.log.Info("gateway client went away", "status", httpapi.StatusClientClosed, "request_id", reqID)
		h.m.request(path, httpapi.StatusClientClosed)
		return
	}
	h.upstreamFailed(w, r, path, err)
}

// ticketTransport reaches the upstream for a call whose reservation may
// still be committing (a Predicted ticket): it forwards at once, cancels the
// upstream call as soon as the reservation is refused, and hands the
// upstream's answer on only once the reservation is durable. Other calls
// pass straight through.
type ticketTransport struct{ next http.RoundTripper }

// lateRefusal is a pre-call check that failed after its call was forwarded.
type lateRefusal struct{ err error }

func (e *lateRefusal) Error() string {
	return "pre-call check failed after forwarding: " + e.err.Error()
}
func (e *lateRefusal) Unwrap() error { return e.err }

func (t ticketTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c, _ := req.Context().Value(ctxKey{}).(*call)
	if c == nil || c.ticket == nil || !c.ticket.Predicted {
		return t.next.RoundTrip(req)
	}
	select {
	case <-c.ticket.Done():
		res, err := c.ticket.Result()
		if err != nil {
			return nil, &lateRefusal{err}
		}
		c.res = res
		return t.next.RoundTrip(req)
	default:
	}
	// A context of its own, ended with the client's: it carries the call
	// but none of the reverse proxy's hooks, which would relay a 1xx
	// answer before the reservation is durable.
	base := context.WithValue(context.Background(), ctxKey{}, c)
	if tr := httptrace.ContextClientTrace(c.up); tr != nil {
		base = httptrace.WithClientTrace(base, tr) // c.wrote
	}
	ctx, cancelCtx := context.WithCancel(base)
	stop := context.AfterFunc(req.Context(), cancelCtx)
	cancel := func() { stop(); cancelCtx() }
	go func() {
		select {
		case <-c.ticket.Done():
			if _, err := c.ticket.Result(); err != nil {
				cancel()
			}
		case <-ctx.Done():
		}
	}()
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	c.ticket.Begin() // the answer is here: nothing left to overlap the commit with
	res, terr := c.ticket.Result()
	if terr != nil {
		if resp != nil {
			resp.Body.Close()
		}
		cancel()
		return nil, &lateRefusal{terr}
	}
	c.res = res
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelOnClose ends the context of an upstream call when its body is
// closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel func()
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
