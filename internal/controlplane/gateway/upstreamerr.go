package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
)

// UpstreamError says why the model upstream could not be reached, in words
// an operator can act on: the upstream's URL and the cause (a DNS lookup
// that failed, a refused connection, a TLS handshake that failed, no route,
// a timeout). The gateway sends its message to the client in Anthropic's
// error envelope, and the control plane's readiness reports it.
type UpstreamError struct {
	// Upstream is the upstream's base URL (without credentials).
	Upstream string
	// Cause is the cause in a few words, e.g. "DNS lookup of
	// api.anthropic.com failed: no such host".
	Cause string
	// Unreachable is true when the request never reached the upstream (it
	// failed while connecting): repeating it at once will fail the same
	// way, so clients are told not to retry.
	Unreachable bool
	// Timeout is true when the upstream did not answer in time.
	Timeout bool
	// KeyRefused is true when the upstream answered but refused the API
	// key (401); Cause is then its status, error type and message.
	KeyRefused bool
	Err        error
}

func (e *UpstreamError) Error() string {
	if e.KeyRefused {
		return "model upstream " + e.Upstream + " refused this platform's API key (" + e.Cause + ")"
	}
	return "model upstream " + e.Upstream + " cannot be reached: " + e.Cause
}

func (e *UpstreamError) Unwrap() error { return e.Err }

// describeUpstreamError explains err, a failed round trip to upstream.
func describeUpstreamError(upstream *url.URL, err error) *UpstreamError {
	host := upstream.Hostname()
	hostport := upstream.Host
	if upstream.Port() == "" {
		if upstream.Scheme == "https" {
			hostport = net.JoinHostPort(host, "443")
		} else {
			hostport = net.JoinHostPort(host, "80")
		}
	}
	e := &UpstreamError{Upstream: upstream.Redacted(), Err: err}
	var dnsErr *net.DNSError
	var opErr *net.OpError
	var certErr *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var hostnameErr x509.HostnameError
	var invalidCert x509.CertificateInvalidError
	var recordErr tls.RecordHeaderError
	var alert tls.AlertError
	var netErr net.Error
	switch {
	case errors.As(err, &dnsErr):
		e.Unreachable = true
		why := dnsErr.Err
		if dnsErr.IsNotFound {
			why = "no such host"
		} else if dnsErr.IsTimeout {
			why = "timed out"
		}
		e.Cause = fmt.Sprintf("DNS lookup of %s failed: %s", dnsErr.Name, why)
	case errors.Is(err, syscall.ECONNREFUSED):
		e.Unreachable = true
		e.Cause = fmt.Sprintf("connection to %s refused (nothing listens there)", hostport)
	case errors.As(err, &certErr), errors.As(err, &unknownCA), errors.As(err, &hostnameErr), errors.As(err, &invalidCert),
		errors.As(err, &recordErr), errors.As(err, &alert), isTLSHandshake(err):
		e.Unreachable = true
		e.Cause = fmt.Sprintf("TLS handshake with %s failed: %s", hostport, tlsReason(err))
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		e.Unreachable = true
		e.Cause = fmt.Sprintf("no route to %s", hostport)
	case errors.As(err, &opErr) && opErr.Op == "proxyconnect":
		e.Unreachable = true
		e.Cause = "connecting through the HTTP proxy failed" + errnoText(err)
	case errors.As(err, &opErr) && opErr.Op == "dial":
		e.Unreachable = true
		e.Timeout = opErr.Timeout()
		e.Cause = fmt.Sprintf("connecting to %s failed", hostport) + errnoText(err)
		if e.Timeout {
			e.Cause = fmt.Sprintf("connecting to %s timed out", hostport)
		}
	case errors.As(err, &netErr) && netErr.Timeout():
		e.Timeout = true
		e.Cause = fmt.Sprintf("%s did not answer in time", hostport)
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		e.Cause = fmt.Sprintf("%s closed the connection before answering", hostport)
	default:
		// Whatever else went wrong (a malformed answer, say) may quote
		// bytes the upstream chose: the cause stays in the log (Err).
		e.Cause = fmt.Sprintf("request to %s failed (the control plane's log has the cause)", hostport)
	}
	return e
}

// errnoText is ": <the system's words>" for the system call error err
// holds (e.g. "permission denied"), else "".
func errnoText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return ": " + errno.Error()
	}
	return ""
}

// isTLSHandshake reports whether err came from a TLS handshake whose error
// has no type of its own (crypto/tls formats many as "tls: ...").
func isTLSHandshake(err error) bool {
	s := err.Error()
	return strings.Contains(s, "tls: ") || strings.Contains(s, "x509: ")
}

// tlsReason is the TLS error without the request's URL around it.
func tlsReason(err error) string {
	s := err.Error()
	for _, mark := range []string{"tls: ", "x509: "} {
		if i := strings.Index(s, mark); i >= 0 {
			return s[i:]
		}
	}
	return s
}

// CheckUpstream reports whether the model upstream resolves, answers over
// the gateway's own transport and takes the API key: it lists the
// upstream's models with the key (GET /v1/models, free at Anthropic), and
// any answer but 401 counts. Otherwise it returns an *UpstreamError naming
// the cause: unreachable (DNS, refused, TLS, timeout), or KeyRefused with
// the upstream's reason. ctx bounds the check.
func (h *Handler) CheckUpstream(ctx context.Context) error {
	return h.checkKey(ctx)
}

// upstreamFailed answers a call whose round trip to the upstream failed, in
// Anthropic's error envelope: 502 api_error (504 timeout_error for a
// timeout) whose message names the upstream and the cause. A call that
// never reached the upstream also gets x-should-retry: false, so the
// agent's turn ends at once with that reason instead of retrying for
// minutes against an upstream that cannot be reached.
func (h *Handler) upstreamFailed(w http.ResponseWriter, r *http.Request, path string, err error) {
	if httpapi.LocalExhaustion(err) {
		// This process is out of open files (its budget refused the
		// dial): a refusal to retry, not a fault of the upstream.
		e := &httpapi.Error{Status: 529, Type: anthropic.ErrOverloaded, Err: err,
			Msg:    "TalkIDE gateway: this control plane has no open files left for another model call right now; retry shortly",
			Header: http.Header{"Retry-After": {"2"}}}
		h.m.request(path, e.Status)
		h.errs.With("gateway out of open files").Write(w, r, e)
		return
	}
	ue := describeUpstreamError(h.cfg.Upstream, err)
	e := &httpapi.Error{Status: http.StatusBadGateway, Type: anthropic.ErrAPI, Err: err, // the whole cause, for the log
		Msg: "TalkIDE gateway: " + ue.Error() + ". Ask the platform's administrator to check the control plane's model upstream (TALKIDE_UPSTREAM_URL) and its network."}
	if ue.Timeout {
		e.Status, e.Type = http.StatusGatewayTimeout, anthropic.ErrTimeout
	}
	if ue.Unreachable {
		e.Header = http.Header{"X-Should-Retry": {"false"}}
	}
	h.m.request(path, e.Status)
	// r is the request to the upstream (httputil.ReverseProxy's): log the
	// path the client called, as the gateway's other lines do.
	if path != "other" {
		r = r.Clone(r.Context())
		r.URL.Path, r.URL.RawPath = contract.PathGatewayPrefix+path, ""
	}
	h.errs.With("gateway upstream failed").Write(w, r, e)
}

// maxNamedErrorBody bounds the upstream error bodies nameRequest rewrites.
const maxNamedErrorBody = 64 << 10

// nameRequest ends the message of an upstream error answer (status ≥ 400,
// Anthropic's JSON envelope) with " (request <id>)", id being the call's
// TalkIDE request id, as the gateway's own refusals do: Claude Code shows
// only the message, and the id finds the call in the worker's and the
// control plane's logs. Anthropic's own request_id and request-id header
// are left as they are (they are what Anthropic's support asks for). An
// answer that is streamed, compressed, over 64 KiB or not such an envelope
// passes unchanged.
func nameRequest(resp *http.Response, id string) {
	if resp.StatusCode < 400 || id == "" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return
	}
	if enc := resp.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		return
	}
	orig := resp.Body
	b, err := io.ReadAll(io.LimitReader(orig, maxNamedErrorBody+1))
	rest := func() {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(b), orig), orig}
	}
	if err != nil || len(b) > maxNamedErrorBody {
		rest()
		return
	}
	start, end, msg, ok := errorMessageAt(b)
	if !ok || httpapi.NamedMessage(msg, id) == msg {
		rest()
		return
	}
	named, _ := json.Marshal(httpapi.NamedMessage(msg, id))
	nb := append(append(append(make([]byte, 0, len(b)+len(named)), b[:start]...), named...), b[end:]...)
	orig.Close()
	resp.Body = io.NopCloser(bytes.NewReader(nb))
	resp.ContentLength = int64(len(nb))
	resp.Header.Set("Content-Length", strconv.Itoa(len(nb)))
}

// errorMessageAt finds error.message in b, an Anthropic error envelope
// ({"type":"error","error":{...,"message":"..."}}): the offsets of its JSON
// string literal and its value. ok is false for anything else, and for an
// envelope with "error" or "message" twice (parsers keep the last one, so
// naming the first would name the copy a client ignores).
func errorMessageAt(b []byte) (start, end int, msg string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	isError, found, errorKeys := false, false, 0
	object := func(each func(key string) error) error {
		if t, err := dec.Token(); err != nil || t != json.Delim('{') {
			return errors.New("not an object")
		}
		for dec.More() {
			t, err := dec.Token()
			if err != nil {
				return err
			}
			if err := each(t.(string)); err != nil {
				return err
			}
		}
		_, err := dec.Token() // the closing brace
		return err
	}
	skip := func() error { var v json.RawMessage; return dec.Decode(&v) }
	err := object(func(key string) error {
		switch key {
		case "type":
			var t string
			if err := dec.Decode(&t); err != nil {
				return err
			}
			isError = t == "error"
			return nil
		case "error":
			if errorKeys++; errorKeys > 1 {
				return errors.New(`"error" twice`)
			}
			return object(func(key string) error {
				if key != "message" {
					return skip()
				}
				if found {
					return errors.New(`"message" twice`)
				}
				var raw json.RawMessage
				if err := dec.Decode(&raw); err != nil {
					return err
				}
				if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &msg) != nil {
					return errors.New("message is not a string")
				}
				end = int(dec.InputOffset())
				start = end - len(raw)
				found = true
				return nil
			})
		}
		return skip()
	})
	if err != nil || !isError || !found {
		return 0, 0, "", false
	}
	return start, end, msg, true
}
