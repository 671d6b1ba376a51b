package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/gateway"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
)

// gatewayTo starts a gateway whose model upstream is upstream, with the
// default transport (as the control plane builds it).
func gatewayTo(t *testing.T, upstream string) (*gateway.Handler, *httptest.Server, token.MasterKey) {
	t.Helper()
	return gatewayLogging(t, upstream, slog.New(slog.DiscardHandler))
}

// postMessages sends a streamed messages call with a WorkerToken signed by
// master to the gateway srv and returns its answer and body.
func postMessages(t *testing.T, srv *httptest.Server, master token.MasterKey) (*http.Response, []byte) {
	t.Helper()
	tok, err := token.NewSigner(token.PurposeGateway, master.Derive(token.PurposeGateway, "", "")).
		Sign(token.Claims{Tenant: "acme", Env: "dev", Conversation: "conv-1", User: "alice"}, token.WorkerTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+contract.PathGatewayPrefix+"/v1/messages",
		strings.NewReader(`{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set(contract.HeaderWorkerToken, tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

// gatewayLogging is gatewayTo logging to log.
func gatewayLogging(t *testing.T, upstream string, log *slog.Logger) (*gateway.Handler, *httptest.Server, token.MasterKey) {
	t.Helper()
	gw, srv, master, _ := gatewayWith(t, upstream, log, nil)
	return gw, srv, master
}

// gatewayWith is gatewayLogging dialling the upstream with dial (nil: the
// default), and returns its budget too.
func gatewayWith(t *testing.T, upstream string, log *slog.Logger, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (*gateway.Handler, *httptest.Server, token.MasterKey, *budget.Service) {
	t.Helper()
	db, err := controlstore.OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	master, err := token.NewMasterKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	svc := budget.NewService(db, budget.Config{})
	gw := gateway.New(gateway.Config{Upstream: u, APIKey: "sk-test", Keys: []token.Key{master.Derive(token.PurposeGateway, "", "")},
		Budget: svc, Logger: log, Dial: dial})
	srv := httptest.NewServer(gw)
	t.Cleanup(func() { srv.Close(); gw.Close(); svc.Close(); db.Close() })
	return gw, srv, master, svc
}

// TestUnreachableUpstreamIsNamed guards a first-run fault found from
// outside: with no
// route to the model upstream, the agent's turn showed ten retries of
// "502 upstream unreachable" over three minutes, and the cause was only in
// the control plane's log. A call that cannot reach the upstream is
// answered with a message naming the upstream and the cause (DNS, refused,
// TLS) and x-should-retry: false, so the turn ends at once with it; the
// readiness check (CheckUpstream) reports the same cause.
func TestUnreachableUpstreamIsNamed(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + closed.Addr().String()
	closed.Close()
	untrusted := httptest.NewUnstartedServer(http.NotFoundHandler()) // a certificate no one trusts
	untrusted.Config.ErrorLog = log.New(io.Discard, "", 0)
	untrusted.StartTLS()
	t.Cleanup(untrusted.Close)
	plain := httptest.NewServer(http.NotFoundHandler()) // speaks HTTP on the https URL
	t.Cleanup(plain.Close)

	for _, tc := range []struct{ name, upstream, cause string }{
		{"dns", "https://upstream.invalid", "DNS lookup of upstream.invalid failed"},
		{"refused", refused, "connection to " + strings.TrimPrefix(refused, "http://") + " refused"},
		{"tls-unknown-authority", untrusted.URL, "TLS handshake with " + strings.TrimPrefix(untrusted.URL, "https://") + " failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"},
		{"tls-not-tls", strings.Replace(plain.URL, "http://", "https://", 1), "TLS handshake with " + strings.TrimPrefix(plain.URL, "http://") + " failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw, srv, master := gatewayTo(t, tc.upstream)
			resp, body := postMessages(t, srv, master)
			var env anthropic.ErrorEnvelope
			if err := json.Unmarshal(body, &env); err != nil || resp.StatusCode != http.StatusBadGateway || env.Error.Type != anthropic.ErrAPI {
				t.Fatalf("got %d %s, want 502 api_error in Anthropic's envelope", resp.StatusCode, body)
			}
			for _, want := range []string{"model upstream " + tc.upstream, tc.cause} {
				if !strings.Contains(env.Error.Message, want) {
					t.Errorf("message %q does not say %q", env.Error.Message, want)
				}
			}
			if got := resp.Header.Get("x-should-retry"); got != "false" {
				t.Errorf("x-should-retry: got %q, want false (retrying cannot reach it either)", got)
			}

			err = gw.CheckUpstream(t.Context())
			var ue *gateway.UpstreamError
			if !errors.As(err, &ue) || !ue.Unreachable || !strings.Contains(err.Error(), tc.cause) {
				t.Errorf("CheckUpstream: got %v, want an unreachable *UpstreamError saying %q", err, tc.cause)
			}
		})
	}

	// An upstream that answers at all is reachable, whatever the status.
	up := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(up.Close)
	gw, _, _ := gatewayTo(t, up.URL)
	if err := gw.CheckUpstream(t.Context()); err != nil {
		t.Errorf("CheckUpstream of a live upstream: %v", err)
	}
}

// TestUpstreamGarbageIsNotQuoted: an upstream that answers something other
// than HTTP makes Go's transport quote its bytes in the error; the client
// gets a 502 that names the upstream but not those bytes, and the log gets
// the whole cause.
func TestUpstreamGarbageIsNotQuoted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// Answer the whole request (not before: a connection that speaks
			// first is only dropped as idle), then hang up.
			if req, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
				io.Copy(io.Discard, req.Body)
			}
			io.WriteString(c, "SSH-2.0-OpenSSH_9.6 /etc/talkide/secret.key\r\n\r\n")
			c.Close()
		}
	}()
	logs := &platformtest.LogBuffer{}
	_, srv, master := gatewayLogging(t, "http://"+ln.Addr().String(), slog.New(slog.NewJSONHandler(logs, nil)))
	resp, body := postMessages(t, srv, master)
	var env anthropic.ErrorEnvelope
	if err := json.Unmarshal(body, &env); err != nil || resp.StatusCode != http.StatusBadGateway ||
		!strings.Contains(env.Error.Message, "model upstream http://"+ln.Addr().String()) {
		t.Fatalf("got %d %s, want a 502 naming the upstream", resp.StatusCode, body)
	}
	if strings.Contains(string(body), "secret.key") || strings.Contains(string(body), "SSH-2.0") {
		t.Errorf("the upstream's bytes reached the client: %s", body)
	}
	if !strings.Contains(logs.String(), "secret.key") {
		t.Errorf("the cause is not in the log:\n%s", logs.String())
	}
}
