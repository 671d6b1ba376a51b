package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/sse"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker/buildmcp"
	"github.com/talkide/talkide/internal/worker/harness"
	"github.com/talkide/talkide/internal/worker/lease"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// Server serves the worker API (package contract, docs/worker-api.md).
type Server struct {
	h *harness.Harness
	// builds, when set, has its builds of a deleted conversation cancelled.
	builds   *buildmcp.Server
	verifier *token.Verifier
	replay   *token.ReplayCache
	log      *slog.Logger
	// heartbeat is the interval of SSE comments on idle streams.
	heartbeat time.Duration
	mux       *http.ServeMux
	handler   http.Handler // mux with JSON 404/405 answers
	// notReady turns /readyz false (shutdown begun).
	notReady atomic.Bool
	// identityFailure, when set, turns /readyz false with its reason (the
	// identity token can no longer mint; watchIdentity).
	identityFailure atomic.Pointer[identityState]
	// identity names this replica in forwarded requests.
	identity string
	// limits, when set, refuses new work near the worker's limits (limits.go).
	limits *admission
	// containment is what agent containment guarantees here (GET /v1/worker).
	containment contract.Containment
}

// NewServer returns the worker API over h. Requests must carry a request
// token of purpose worker-request for (tenant, env), signed with one of keys.
func NewServer(h *harness.Harness, tenant, env string, keys []token.Key, log *slog.Logger) *Server {
	s := &Server{
		identity:  tenant + "/" + env,
		h:         h,
		verifier:  token.NewVerifier(token.PurposeWorkerRequest, keys...).ForSubject(tenant, env),
		replay:    token.NewReplayCache(),
		log:       httpapi.WithRequestIDs(log),
		heartbeat: 15 * time.Second,
		mux:       http.NewServeMux(),
	}
	s.route("POST "+contract.PathSession, s.admitting(s.createSession))
	s.route("POST "+contract.PathMessages, s.admitting(s.sendMessage))
	s.route("POST "+contract.PathInterrupt, s.interrupt)
	s.route("POST "+contract.PathStop, s.stop)
	s.route("GET "+contract.PathStatus, s.status)
	s.route("DELETE "+contract.PathStatus, s.deleteSession)
	s.route("GET "+contract.PathEvents, s.streaming(s.events))
	s.route("POST "+contract.PathPermission, s.answerPermission)
	s.mux.Handle("GET "+contract.PathWorker, httpapi.Handle(s.log, func(w http.ResponseWriter, r *http.Request) error {
		body, err := httpapi.ReadBody(w, r, httpapi.DefaultMaxBody)
		if err != nil {
			return err
		}
		if err := s.authenticate(r, body); err != nil {
			return err
		}
		httpapi.AdoptRequestID(w, r)
		httpapi.WriteJSON(w, http.StatusOK, contract.WorkerInfo{WorkerID: s.identity, Containment: s.containment})
		return nil
	}))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if st := s.identityFailure.Load(); st != nil {
			httpapi.WriteJSON(w, http.StatusServiceUnavailable, st.readiness())
			return
		}
		if s.notReady.Load() {
			httpapi.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready"})
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	// Every caller of the worker API is a control plane or a peer replica
	// (requests are token-checked), so their request ids are kept.
	s.handler = httpapi.RequestIDs(httpapi.Routes(s.mux, s.log))
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

type ctxKeyBody struct{}

// route registers an authenticated handler: the request token is checked
// before the handler runs; the handler gets the verified body from the context.
func (s *Server) route(pattern string, h httpapi.HandlerFunc) {
	s.mux.Handle(pattern, httpapi.Handle(s.log, func(w http.ResponseWriter, r *http.Request) error {
		body, err := httpapi.ReadBody(w, r, httpapi.DefaultMaxBody)
		if err != nil {
			return err
		}
		if err := s.authenticate(r, body); err != nil {
			return err
		}
		// The control plane signed this request: its id (the browser
		// request's) names the request here too.
		httpapi.AdoptRequestID(w, r)
		if err := contract.ValidConversationID(r.PathValue("id")); err != nil {
			return httpapi.BadRequest("%v", err)
		}
		err = h(w, r.WithContext(context.WithValue(r.Context(), ctxKeyBody{}, body)))
		var noe *harness.NotOwnerError
		if errors.As(err, &noe) {
			return s.forward(w, r, body, noe.Owner)
		}
		return err
	}))
}

// HeaderForwarded marks a request one replica forwarded to the owner of its
// conversation; a replica never forwards such a request again.
const HeaderForwarded = "X-Talkide-Forwarded-By"

// forward sends a request for a conversation another replica owns to that
// replica, unchanged (the request token stays valid: same method, path and
// body), and streams the answer back. When the owner cannot be reached the
// client gets 503 and retries; by then the owner's lease may have expired
// and this replica takes the conversation over.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, body []byte, owner lease.Record) error {
	unavailable := func(msg string, cause error) error {
		return &httpapi.Error{Status: http.StatusServiceUnavailable, Type: contract.ErrTypeUnavailable, Msg: msg, Err: cause,
			Header: http.Header{"Retry-After": {"1"}}}
	}
	if r.Header.Get(HeaderForwarded) != "" {
		return unavailable("conversation is moving between replicas; retry shortly", errors.New("forwarded request reached a non-owner"))
	}
	target, err := url.Parse(owner.Address)
	if err != nil || owner.Address == "" {
		return unavailable("conversation owned by a replica without an address; retry shortly", err)
	}
	var proxyErr error
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path, pr.Out.URL.RawPath = r.URL.Path, r.URL.RawPath
			pr.Out.URL.RawQuery = r.URL.RawQuery
			pr.Out.Header.Set(HeaderForwarded, s.identity)
		},
		FlushInterval: -1, // event streams pass event by event
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			proxyErr = err
		},
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	rp.ServeHTTP(w, r)
	if proxyErr != nil && r.Context().Err() == nil {
		return unavailable("the replica owning this conversation is unreachable; retry shortly", fmt.Errorf("forward to owner %s: %w", owner.Holder, proxyErr))
	}
	return nil
}

func (s *Server) authenticate(r *http.Request, body []byte) error {
	raw := r.Header.Get(contract.HeaderWorkerToken)
	if raw == "" {
		return httpapi.Unauthorized("missing "+contract.HeaderWorkerToken, nil)
	}
	c, err := s.verifier.Verify(raw)
	if err != nil {
		// A warning (only the control plane holds the request key); the
		// cause is on the request's error line.
		s.log.WarnContext(r.Context(), "refused worker request token", "path", r.URL.Path, "token", token.Fingerprint(raw))
		return httpapi.Unauthorized("invalid request token", err)
	}
	if err := token.CheckRequest(c, r.Method, r.URL.RequestURI(), body); err != nil {
		return httpapi.Unauthorized("request token not valid for this request", err)
	}
	if err := s.replay.Check(c); err != nil {
		return httpapi.Unauthorized("request token already used", err)
	}
	return nil
}

func body(r *http.Request) []byte { b, _ := r.Context().Value(ctxKeyBody{}).([]byte); return b }

// mapErr turns harness errors into HTTP errors.
func mapErr(err error) error {
	if re := exhaustionError(err); re != nil {
		return re
	}
	var he *httpapi.Error
	if errors.As(err, &he) {
		return he // a refusal made by the worker itself (admission)
	}
	switch {
	case errors.Is(err, harness.ErrNotFound):
		return httpapi.NotFound("conversation not found")
	case errors.Is(err, harness.ErrInvalid):
		return httpapi.BadRequest("%v", err)
	case errors.Is(err, harness.ErrTooLarge):
		return httpapi.Errorf(http.StatusRequestEntityTooLarge, contract.ErrTypeTooLarge, "%v", err)
	case errors.Is(err, harness.ErrUserMismatch):
		return httpapi.Forbidden("conversation belongs to another user", err)
	case errors.Is(err, harness.ErrPermissionNotFound):
		return httpapi.NotFound("permission request not found")
	case errors.Is(err, harness.ErrConflict):
		return httpapi.Errorf(http.StatusConflict, contract.ErrTypeConflict, "%v", err)
	case errors.Is(err, harness.ErrPermissionResolved):
		return httpapi.Errorf(http.StatusConflict, contract.ErrTypeConflict, "permission request already resolved")
	case errors.Is(err, harness.ErrQuota):
		return httpapi.Errorf(http.StatusTooManyRequests, contract.ErrTypeRateLimited, "%v", err)
	case errors.Is(err, harness.ErrUnavailable):
		return &httpapi.Error{Status: http.StatusServiceUnavailable, Type: contract.ErrTypeUnavailable,
			Msg: "conversation temporarily unavailable; retry shortly", Err: err, Header: http.Header{"Retry-After": {"1"}}}
	}
	return err
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) error {
	var req contract.CreateSessionRequest
	if err := httpapi.DecodeJSON(r, body(r), &req); err != nil {
		return err
	}
	st, err := s.h.CreateSession(r.PathValue("id"), req)
	if err != nil {
		return mapErr(err)
	}
	httpapi.WriteJSON(w, http.StatusOK, st)
	return nil
}

func (s *Server) sendMessage(w http.ResponseWriter, r *http.Request) error {
	var req contract.SendMessageRequest
	if err := httpapi.DecodeJSON(r, body(r), &req); err != nil {
		return err
	}
	resp, err := s.h.SendMessage(r.PathValue("id"), req)
	if err != nil {
		return mapErr(err)
	}
	httpapi.WriteJSON(w, http.StatusAccepted, resp)
	return nil
}

func (s *Server) interrupt(w http.ResponseWriter, r *http.Request) error {
	ok, err := s.h.Interrupt(r.PathValue("id"))
	if err != nil {
		return mapErr(err)
	}
	httpapi.WriteJSON(w, http.StatusAccepted, contract.InterruptResponse{Interrupted: ok})
	return nil
}

func (s *Server) stop(w http.ResponseWriter, r *http.Request) error {
	st, err := s.h.Stop(r.PathValue("id"))
	if err != nil {
		return mapErr(err)
	}
	httpapi.WriteJSON(w, http.StatusOK, st)
	return nil
}

func (s *Server) answerPermission(w http.ResponseWriter, r *http.Request) error {
	var a contract.PermissionAnswer
	if err := httpapi.DecodeJSON(r, body(r), &a); err != nil {
		return err
	}
	res, err := s.h.AnswerPermission(r.PathValue("id"), r.PathValue("request_id"), a)
	if err != nil {
		return mapErr(err)
	}
	httpapi.WriteJSON(w, http.StatusOK, res)
	return nil
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) error {
	st, err := s.h.Status(r.PathValue("id"))
	if err != nil {
		return mapErr(err)
	}
	httpapi.WriteJSON(w, http.StatusOK, st)
	return nil
}

// events streams the conversation's events after Last-Event-ID (header, or
// the "after" query parameter) until the client leaves.
func (s *Server) events(w http.ResponseWriter, r *http.Request) error {
	after, err := lastEventID(r)
	if err != nil {
		return err
	}
	var sw *sse.Writer
	started := func() error {
		if sw == nil {
			sw = sse.NewWriter(w)
			w.WriteHeader(http.StatusOK)
			return sw.Flush()
		}
		return nil
	}
	err = s.h.Follow(r.Context(), r.PathValue("id"), after, s.heartbeat, func(ev contract.Event) error {
		if err := started(); err != nil {
			return err
		}
		return sw.WriteJSON(strconv.FormatInt(ev.ID, 10), string(ev.Type), ev)
	}, func() error {
		if err := started(); err != nil {
			return err
		}
		return sw.WriteComment("heartbeat")
	}, started)
	if sw == nil {
		return mapErr(err) // refused before the stream began
	}
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, sessionstore.ErrClosed) {
		s.log.InfoContext(r.Context(), "event stream ended", "conversation", r.PathValue("id"), "err", err)
	}
	return nil // the stream has started: nothing more can be answered
}

func lastEventID(r *http.Request) (int64, error) {
	v := r.Header.Get(contract.HeaderLastEventID)
	if v == "" {
		v = r.URL.Query().Get("after")
	}
	id, err := sse.ParseID(v)
	if err != nil {
		return 0, httpapi.BadRequest("%v", err)
	}
	return id, nil
}
