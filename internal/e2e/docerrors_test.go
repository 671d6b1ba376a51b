package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/apidoc"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker"
	"github.com/talkide/talkide/internal/worker/harness"
)

// probe is one request that should be answered with a documented error.
type probe struct {
	// endpoint is "METHOD /path" as the document's section heading writes
	// it; "" for a refusal common to every endpoint (unknown route, wrong
	// method), checked against the error table only.
	endpoint string
	name     string
	status   int
	do       func() (int, contract.ErrorBody)
}

// notProbed are documented errors no probe here provokes, keyed
// "STATUS" (every endpoint of the document) or "METHOD /path STATUS", each
// with what causes it and which test covers it instead. A documented error
// with neither a probe nor an entry here fails TestDocumentedErrors.
var notProbed = map[string]map[string]string{
	"docs/browser-api.md": {
		"500": "an unexpected failure (the database fails); nothing from outside causes one",
		"502": "the worker answers 5xx or refuses the control plane's own credentials: internal/controlplane's worker error tests, TestUnreachableUpstreamEndsTheTurnAtOnce (its turn)",
		// The worker unreachable is probed (the last probes stop it).
		"GET /api/conversations/{id}/stream 503": "the control plane at its stream cap, out of open files or shutting down (an unreachable worker keeps the stream open and reconnects): internal/controlplane TestStreamThatCannotReachItsWorkerIsAnError and its limits and shutdown tests",
	},
	"docs/worker-api.md": {
		"500":              "a state file or the event log cannot be written, or a deleted conversation's files cannot be removed; nothing from outside causes one",
		"503":              "the worker at one of its limits or shutting down: internal/worker TestAdmissionRefusesNearTheLimits, TestExhaustionErrorsAreRefusals and the shutdown tests",
		"GET /metrics 403": "a worker without TALKIDE_METRICS_TOKEN: internal/worker TestWorkerMetricsNeedAToken (this worker has one, to probe the 401)",
	},
}

// TestDocumentedErrors keeps the error documentation of docs/browser-api.md
// and docs/worker-api.md in step with a real control plane and worker
// (the real CLI behind them): every probe's answer has the status it
// expects and the type the document's error table gives that status; the
// endpoint's "Errors" paragraph lists that status; a type the table calls
// unused is never answered; and every status an "Errors" paragraph lists
// has a probe here or a notProbed entry saying what covers it.
// (internal/contract's TestErrorTablesDocumented checks the tables against
// the ErrType* constants.)
func TestDocumentedErrors(t *testing.T) {
	const metricsToken = "metrics-token-for-the-doc-test-0123"
	p := platformtest.Start(t, platformtest.Options{
		ControlPlane: func(c *controlplane.Config) { c.MaxConversationsPerUser = 3 },
		Worker: func(c *worker.Config) {
			c.PermissionPolicy = harness.PolicyAsk
			c.MaxConversationsPerUser = 3
			c.MetricsToken = metricsToken
		},
	})
	conv := p.NewConversation()
	conv2 := p.NewConversation() // for the probes with the worker gone
	p.AddUser("mallory", "tk_mallory", [2]string{"other", "dev"})
	p.AddUser("quota", "tk_quota", [2]string{"demo", "dev"})
	const json = "application/json"
	browser := func(tok, method, path, ct, body string) func() (int, contract.ErrorBody) {
		return func() (int, contract.ErrorBody) { return p.DoAs(tok, method, path, ct, body) }
	}
	me := p.UserToken
	convPath := "/api/conversations/" + conv

	// A pending permission request, answered once: answering it again is
	// the documented 409 of both APIs.
	stream := p.OpenStream(conv, 0)
	p.Send(conv, "please run `echo doc-errors > f.txt && cat f.txt`")
	ev := stream.Until(90*time.Second, func(ev contract.Event) bool {
		return ev.Type == contract.EventPermissionRequested || platformtest.TurnEnd(ev)
	})
	if ev.Type != contract.EventPermissionRequested {
		t.Fatalf("no permission request: the turn ended with %s: %s", ev.Type, ev.Data)
	}
	reqID := platformtest.Payload[contract.PermissionRequested](t, ev).RequestID
	if st, eb := p.DoAs(me, "POST", convPath+"/permissions/"+reqID, json, `{"behavior":"allow"}`); st != http.StatusOK {
		t.Fatalf("answer the permission request: %d %+v", st, eb)
	}
	stream.Until(90*time.Second, platformtest.TurnEnd)
	// A message id accepted with one text; sent again with another, 409.
	if st, eb := p.DoAs(me, "POST", convPath+"/messages", json, `{"text":"hello","client_message_id":"doc-1"}`); st != http.StatusAccepted {
		t.Fatalf("send: %d %+v", st, eb)
	}
	// The quota user fills their place (3 conversations).
	for i := range 3 {
		if st, eb := p.DoAs("tk_quota", "POST", "/api/conversations", json, `{"tenant":"demo","env":"dev"}`); st != http.StatusCreated {
			t.Fatalf("quota user's conversation %d: %d %+v", i+1, st, eb)
		}
	}

	const (
		create   = "POST /api/conversations"
		get      = "GET /api/conversations/{id}"
		del      = "DELETE /api/conversations/{id}"
		messages = "POST /api/conversations/{id}/messages"
		intr     = "POST /api/conversations/{id}/interrupt"
		perm     = "POST /api/conversations/{id}/permissions/{request_id}"
		strm     = "GET /api/conversations/{id}/stream"
		meEP     = "GET /api/me"
		list     = "GET /api/conversations"
		rename   = "PATCH /api/conversations/{id}"
		calls    = "GET /api/conversations/{id}/calls"
	)
	demo := `{"tenant":"demo","env":"dev"}`
	browserProbes := []probe{
		{meEP, "no token", 401, browser("", "GET", "/api/me", "", "")},
		{meEP, "unknown parameter", 400, browser(me, "GET", "/api/me?tenantt=demo", "", "")},
		{meEP, "malformed tenant", 400, browser(me, "GET", "/api/me?tenant=Not+A+Tenant", "", "")},
		{meEP, "a tenant without a grant", 403, browser(me, "GET", "/api/me?tenant=elsewhere", "", "")},
		{list, "no token", 401, browser("", "GET", "/api/conversations", "", "")},
		{list, "limit out of range", 400, browser(me, "GET", "/api/conversations?limit=1000", "", "")},
		{list, "a cursor this API did not give", 400, browser(me, "GET", "/api/conversations?cursor=bogus", "", "")},
		{list, "repeated parameter", 400, browser(me, "GET", "/api/conversations?env=dev&env=dev", "", "")},
		{rename, "no token", 401, browser("", "PATCH", convPath, json, `{"title":"x"}`)},
		{rename, "missing title", 400, browser(me, "PATCH", convPath, json, `{}`)},
		{rename, "title of two lines", 400, browser(me, "PATCH", convPath, json, `{"title":"a\nb"}`)},
		{rename, "another user's conversation", 404, browser("tk_mallory", "PATCH", convPath, json, `{"title":"x"}`)},
		{rename, "body too large", 413, browser(me, "PATCH", convPath, json, `{"title":"`+strings.Repeat("t", 64<<10)+`"}`)},
		{rename, "wrong content type", 415, browser(me, "PATCH", convPath, "text/plain", `{"title":"x"}`)},
		{create, "no token", 401, browser("", "POST", "/api/conversations", json, demo)},
		{create, "unknown token", 401, browser("tk_nobody", "POST", "/api/conversations", json, demo)},
		{create, "tenant-env without grant", 403, browser("tk_mallory", "POST", "/api/conversations", json, demo)},
		{create, "invalid tenant name", 400, browser(me, "POST", "/api/conversations", json, `{"tenant":"../etc","env":"dev"}`)},
		{create, "malformed JSON", 400, browser(me, "POST", "/api/conversations", json, `{"tenant":`)},
		{create, "unknown field", 400, browser(me, "POST", "/api/conversations", json, `{"tenant":"demo","env":"dev","x":1}`)},
		{create, "unknown sample", 400, browser(me, "POST", "/api/conversations", json, `{"tenant":"demo","env":"dev","sample":"no-such-sample"}`)},
		{create, "body over 16 KiB", 413, browser(me, "POST", "/api/conversations", json, `{"tenant":"demo","env":"dev","model":"`+strings.Repeat("m", 17<<10)+`"}`)},
		{create, "wrong content type", 415, browser(me, "POST", "/api/conversations", "text/plain", demo)},
		{create, "over the user's quota", 429, browser("tk_quota", "POST", "/api/conversations", json, demo)},
		{get, "no token", 401, browser("", "GET", convPath, "", "")},
		{get, "another user's conversation", 404, browser("tk_mallory", "GET", convPath, "", "")},
		{get, "unknown conversation", 404, browser(me, "GET", "/api/conversations/nope", "", "")},
		{calls, "no token", 401, browser("", "GET", convPath+"/calls?request_id=req_1", "", "")},
		{calls, "no request id", 400, browser(me, "GET", convPath+"/calls", "", "")},
		{calls, "malformed request id", 400, browser(me, "GET", convPath+"/calls?request_id=req%2F1", "", "")},
		{calls, "another parameter", 400, browser(me, "GET", convPath+"/calls?request_id=req_1&after=2", "", "")},
		{calls, "another user's conversation", 404, browser("tk_mallory", "GET", convPath+"/calls?request_id=req_1", "", "")},
		{del, "no token", 401, browser("", "DELETE", convPath, "", "")},
		{del, "another user's conversation", 404, browser("tk_mallory", "DELETE", convPath, "", "")},
		{messages, "no token", 401, browser("", "POST", convPath+"/messages", json, `{"text":"hi"}`)},
		{messages, "another user's conversation", 404, browser("tk_mallory", "POST", convPath+"/messages", json, `{"text":"hi"}`)},
		{messages, "unknown conversation", 404, browser(me, "POST", "/api/conversations/nope/messages", json, `{"text":"hi"}`)},
		{messages, "empty text", 400, browser(me, "POST", convPath+"/messages", json, `{"text":"  "}`)},
		{messages, "bad client message id", 400, browser(me, "POST", convPath+"/messages", json, `{"text":"hi","client_message_id":"a/b"}`)},
		{messages, "client message id reused with another text", 409, browser(me, "POST", convPath+"/messages", json, `{"text":"another","client_message_id":"doc-1"}`)},
		{messages, "oversized text", 413, browser(me, "POST", convPath+"/messages", json, `{"text":"`+strings.Repeat("x", contract.MaxMessageBytes+1)+`"}`)},
		{messages, "wrong content type", 415, browser(me, "POST", convPath+"/messages", "text/plain", `{"text":"hi"}`)},
		{intr, "no token", 401, browser("", "POST", convPath+"/interrupt", "", "")},
		{intr, "unknown conversation", 404, browser(me, "POST", "/api/conversations/nope/interrupt", "", "")},
		{perm, "behavior neither allow nor deny", 400, browser(me, "POST", convPath+"/permissions/"+reqID, json, `{"behavior":"maybe"}`)},
		{perm, "no token", 401, browser("", "POST", convPath+"/permissions/"+reqID, json, `{"behavior":"allow"}`)},
		{perm, "unknown permission request", 404, browser(me, "POST", convPath+"/permissions/nope", json, `{"behavior":"allow"}`)},
		{perm, "wrong content type", 415, browser(me, "POST", convPath+"/permissions/"+reqID, "text/plain", `{"behavior":"allow"}`)},
		{perm, "answered already", 409, browser(me, "POST", convPath+"/permissions/"+reqID, json, `{"behavior":"deny"}`)},
		{strm, "bad Last-Event-ID", 400, browser(me, "GET", convPath+"/stream?after=x", "", "")},
		{strm, "Last-Event-ID beyond the newest event", 400, browser(me, "GET", convPath+"/stream?after=100000", "", "")},
		{strm, "no token", 401, browser("", "GET", convPath+"/stream", "", "")},
		{strm, "another user's stream", 404, browser("tk_mallory", "GET", convPath+"/stream", "", "")},
		{"", "unknown endpoint", 404, browser(me, "GET", "/api/nothing", "", "")},
		{"", "known path, another method", 405, browser(me, "PUT", convPath+"/messages", json, `{}`)},
		// Last: deletes the conversation the others use.
		{del, "deleted already", 404, func() (int, contract.ErrorBody) {
			if st, eb := p.DoAs(me, "DELETE", convPath, "", ""); st != http.StatusNoContent {
				t.Errorf("delete: %d %+v", st, eb)
			}
			return p.DoAs(me, "DELETE", convPath, "", "")
		}},
	}

	// The worker gone: the 503 of every endpoint that needs it. The
	// control plane retries some for 15 s, so they run at once, the first
	// time one of them is asked for.
	var down sync.Once
	downResults := map[string]chan [2]any{}
	downReqs := []struct{ key, method, path, ct, body string }{
		{"create", "POST", "/api/conversations", json, demo},
		{"get", "GET", "/api/conversations/" + conv2, "", ""},
		{"delete", "DELETE", "/api/conversations/" + conv2, "", ""},
		{"messages", "POST", "/api/conversations/" + conv2 + "/messages", json, `{"text":"hi"}`},
		{"interrupt", "POST", "/api/conversations/" + conv2 + "/interrupt", "", ""},
		{"permission", "POST", "/api/conversations/" + conv2 + "/permissions/some-request", json, `{"behavior":"allow"}`},
	}
	for _, r := range downReqs {
		downResults[r.key] = make(chan [2]any, 1)
	}
	workerGone := func(key string) func() (int, contract.ErrorBody) {
		return func() (int, contract.ErrorBody) {
			down.Do(func() {
				p.StopWorker()
				for _, r := range downReqs {
					go func() {
						st, eb := p.DoAs(me, r.method, r.path, r.ct, r.body)
						downResults[r.key] <- [2]any{st, eb}
					}()
				}
			})
			r := <-downResults[key]
			return r[0].(int), r[1].(contract.ErrorBody)
		}
	}
	browserProbes = append(browserProbes,
		probe{create, "worker unreachable", 503, workerGone("create")},
		probe{get, "worker unreachable", 503, workerGone("get")},
		probe{del, "worker unreachable", 503, workerGone("delete")},
		probe{messages, "worker unreachable", 503, workerGone("messages")},
		probe{intr, "worker unreachable", 503, workerGone("interrupt")},
		probe{perm, "worker unreachable", 503, workerGone("permission")},
	)

	// The worker, called as the control plane does: signed request tokens.
	signer := token.NewSigner(token.PurposeWorkerRequest, p.Master.Derive(token.PurposeWorkerRequest, p.Tenant, p.Env))
	wdo := func(sign bool, method, path, ct, body string, header ...string) func() (int, contract.ErrorBody) {
		return func() (int, contract.ErrorBody) {
			req, _ := http.NewRequest(method, p.WorkerURL+path, bytes.NewReader([]byte(body)))
			if sign {
				tok, err := signer.Sign(token.RequestClaims(p.Tenant, p.Env, method, req.URL.RequestURI(), []byte(body)), token.RequestTokenTTL)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set(contract.HeaderWorkerToken, tok)
			}
			if ct != "" {
				req.Header.Set("Content-Type", ct)
			}
			for i := 0; i+1 < len(header); i += 2 {
				req.Header.Set(header[i], header[i+1])
			}
			return doRaw(t, req)
		}
	}
	w := func(method, path, body string) func() (int, contract.ErrorBody) {
		ct := ""
		if body != "" {
			ct = json
		}
		return wdo(true, method, path, ct, body)
	}
	wc := "/v1/conversations/wdoc"
	for _, step := range []struct{ method, path, body string }{
		{"POST", wc + "/session", `{"user_id":"u1"}`},
		{"POST", wc + "/messages", `{"client_message_id":"w-1","user_id":"u1","text":"hello"}`},
		{"POST", "/v1/conversations/wq1/session", `{"user_id":"wq"}`},
		{"POST", "/v1/conversations/wq2/session", `{"user_id":"wq"}`},
		{"POST", "/v1/conversations/wq3/session", `{"user_id":"wq"}`},
	} {
		if st, eb := w(step.method, step.path, step.body)(); st >= 300 {
			t.Fatalf("worker %s %s: %d %+v", step.method, step.path, st, eb)
		}
	}
	const (
		wSession  = "POST /v1/conversations/{id}/session"
		wMessages = "POST /v1/conversations/{id}/messages"
		wIntr     = "POST /v1/conversations/{id}/interrupt"
		wPerm     = "POST /v1/conversations/{id}/permissions/{request_id}"
		wStop     = "POST /v1/conversations/{id}/stop"
		wStatus   = "GET /v1/conversations/{id}"
		wDelete   = "DELETE /v1/conversations/{id}"
		wEvents   = "GET /v1/conversations/{id}/events"
		wMetrics  = "GET /metrics"
	)
	big := `{"user_id":"u1","model":"` + strings.Repeat("m", 1<<20) + `"}`
	workerProbes := []probe{
		{wSession, "no request token", 401, wdo(false, "POST", wc+"/session", json, `{"user_id":"u1"}`)},
		{wSession, "missing user_id", 400, w("POST", "/v1/conversations/wnew/session", `{}`)},
		{wSession, "bad conversation id", 400, w("POST", "/v1/conversations/_bad/session", `{"user_id":"u1"}`)},
		{wSession, "another user's session", 403, w("POST", wc+"/session", `{"user_id":"u2"}`)},
		{wSession, "body over 1 MiB", 413, w("POST", "/v1/conversations/wbig/session", big)},
		{wSession, "wrong content type", 415, wdo(true, "POST", "/v1/conversations/wct/session", "text/plain", `{"user_id":"u1"}`)},
		{wSession, "over the user's cap", 429, w("POST", "/v1/conversations/wq4/session", `{"user_id":"wq"}`)},
		{wMessages, "empty text", 400, w("POST", wc+"/messages", `{"client_message_id":"w-2","user_id":"u1","text":""}`)},
		{wMessages, "no request token", 401, wdo(false, "POST", wc+"/messages", json, `{"client_message_id":"w-2","user_id":"u1","text":"hi"}`)},
		{wMessages, "another user", 403, w("POST", wc+"/messages", `{"client_message_id":"w-2","user_id":"u2","text":"hi"}`)},
		{wMessages, "no session", 404, w("POST", "/v1/conversations/wnone/messages", `{"client_message_id":"w-2","user_id":"u1","text":"hi"}`)},
		{wMessages, "client message id reused with another text", 409, w("POST", wc+"/messages", `{"client_message_id":"w-1","user_id":"u1","text":"another"}`)},
		{wMessages, "oversized text", 413, w("POST", wc+"/messages", `{"client_message_id":"w-3","user_id":"u1","text":"`+strings.Repeat("x", contract.MaxMessageBytes+1)+`"}`)},
		{wMessages, "wrong content type", 415, wdo(true, "POST", wc+"/messages", "text/plain", `{"client_message_id":"w-4","user_id":"u1","text":"hi"}`)},
		{wIntr, "bad conversation id", 400, w("POST", "/v1/conversations/_bad/interrupt", "")},
		{wIntr, "no request token", 401, wdo(false, "POST", wc+"/interrupt", "", "")},
		{wIntr, "no session", 404, w("POST", "/v1/conversations/wnone/interrupt", "")},
		{wPerm, "behavior neither allow nor deny", 400, w("POST", "/v1/conversations/"+conv+"/permissions/"+reqID, `{"behavior":"maybe"}`)},
		{wPerm, "no request token", 401, wdo(false, "POST", wc+"/permissions/x", json, `{"behavior":"allow"}`)},
		{wPerm, "unknown permission request", 404, w("POST", wc+"/permissions/nope", `{"behavior":"allow"}`)},
		{wPerm, "answered already", 409, w("POST", "/v1/conversations/"+conv+"/permissions/"+reqID, `{"behavior":"deny"}`)},
		{wPerm, "wrong content type", 415, wdo(true, "POST", wc+"/permissions/x", "text/plain", `{"behavior":"allow"}`)},
		{wStop, "bad conversation id", 400, w("POST", "/v1/conversations/_bad/stop", "")},
		{wStop, "no request token", 401, wdo(false, "POST", wc+"/stop", "", "")},
		{wStop, "no session", 404, w("POST", "/v1/conversations/wnone/stop", "")},
		{wStatus, "bad conversation id", 400, w("GET", "/v1/conversations/_bad", "")},
		{wStatus, "no request token", 401, wdo(false, "GET", wc, "", "")},
		{wStatus, "no session", 404, w("GET", "/v1/conversations/wnone", "")},
		{wDelete, "bad conversation id", 400, w("DELETE", "/v1/conversations/_bad", "")},
		{wDelete, "no request token", 401, wdo(false, "DELETE", wc, "", "")},
		{wDelete, "no session", 404, w("DELETE", "/v1/conversations/wnone", "")},
		{wEvents, "bad resume point", 400, w("GET", wc+"/events?after=x", "")},
		{wEvents, "resume point beyond the newest event", 400, wdo(true, "GET", wc+"/events", "", "", contract.HeaderLastEventID, "100000")},
		{wEvents, "no request token", 401, wdo(false, "GET", wc+"/events", "", "")},
		{wEvents, "no session", 404, w("GET", "/v1/conversations/wnone/events", "")},
		{wMetrics, "no metrics token", 401, wdo(false, "GET", "/metrics", "", "")},
		{wMetrics, "another metrics token", 401, wdo(false, "GET", "/metrics", "", "", "Authorization", "Bearer not-the-"+metricsToken)},
		{"", "unknown endpoint", 404, w("GET", "/v1/nothing", "")},
		{"", "known path, another method", 405, w("PUT", wc+"/messages", `{}`)},
	}

	// The worker's first: the browser's last probe deletes conv.
	checkDocumentedErrors(t, "docs/worker-api.md", workerProbes)
	checkDocumentedErrors(t, "docs/browser-api.md", browserProbes)
}

// checkDocumentedErrors runs the probes of one document and holds their
// answers and the document to each other.
func checkDocumentedErrors(t *testing.T, name string, probes []probe) {
	t.Helper()
	d, err := apidoc.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	typeOf := map[int]string{}
	for typ, row := range d.Types {
		typeOf[row.Status] = typ
	}
	probed := map[string]bool{}
	for _, pr := range probes {
		where := name + " (any endpoint)"
		if pr.endpoint != "" {
			where = d.Where(pr.endpoint)
		}
		st, eb := pr.do()
		switch {
		case st != pr.status:
			t.Errorf("%s, %s: got %d %+v, want %d", where, pr.name, st, eb, pr.status)
			continue
		case eb.Error.Type != typeOf[st] || eb.Error.Message == "":
			t.Errorf("%s, %s: got %d %q (message %q); the error table gives %d the type %q (and every error has a message)", where, pr.name, st, eb.Error.Type, eb.Error.Message, st, typeOf[st])
		case d.Types[eb.Error.Type].Unused:
			t.Errorf("%s:%d: the error table says %s is %q, but %s answers it (%s)", name, d.Types[eb.Error.Type].Line, eb.Error.Type, d.Types[eb.Error.Type].When, pr.endpoint, pr.name)
		}
		if pr.endpoint == "" {
			continue
		}
		e := d.Endpoints[pr.endpoint]
		switch {
		case e == nil:
			t.Errorf("%s: no section documents %s, which answers %d %s (%s)", name, pr.endpoint, st, eb.Error.Type, pr.name)
		case e.Line == 0:
			t.Errorf("%s: §%s %s has no \"Errors:\" paragraph, but answers %d %s (%s)", name, e.Section, pr.endpoint, st, eb.Error.Type, pr.name)
		default:
			if _, ok := e.Errors[st]; !ok {
				t.Errorf("%s, %s: the code answers %d %s, but the Errors paragraph does not list %d", where, pr.name, st, eb.Error.Type, st)
			}
		}
		probed[pr.endpoint+" "+strconv.Itoa(pr.status)] = true
	}
	for _, ep := range slices.Sorted(maps.Keys(d.Endpoints)) {
		e := d.Endpoints[ep]
		for _, st := range slices.Sorted(maps.Keys(e.Errors)) {
			if named := e.Errors[st]; named != "" && named != typeOf[st] {
				t.Errorf("%s: writes `%d %s`, but the error table gives %d the type %s", d.Where(ep), st, named, st, typeOf[st])
			}
			if _, ok := typeOf[st]; !ok {
				t.Errorf("%s: lists %d, which the error table does not have", d.Where(ep), st)
			}
			key := ep + " " + strconv.Itoa(st)
			if probed[key] || notProbed[name][key] != "" || notProbed[name][strconv.Itoa(st)] != "" {
				continue
			}
			t.Errorf("%s: documents %d %s, but no probe of TestDocumentedErrors (internal/e2e/docerrors_test.go) answers it: add one, or, if it cannot be provoked against a healthy platform, a notProbed entry naming the test that covers it", d.Where(ep), st, typeOf[st])
		}
	}
}

// doRaw sends req and decodes an error body.
func doRaw(t *testing.T, req *http.Request) (int, contract.ErrorBody) {
	t.Helper()
	// A stream answered 200 by mistake would otherwise never end.
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var eb contract.ErrorBody
	if err := json.Unmarshal(b, &eb); err != nil && resp.StatusCode >= 400 {
		return resp.StatusCode, contract.ErrorBody{Error: contract.ErrorDetail{Message: fmt.Sprintf("(not an error body: %q)", b)}}
	}
	return resp.StatusCode, eb
}
