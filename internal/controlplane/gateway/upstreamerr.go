package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
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
