package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/controlplane/workerclient"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/sse"
	"github.com/talkide/talkide/internal/token"
)

// Server is the control plane's HTTP handler.
type Server struct {
	cfg     Config
	db      *controlstore.DB
	master  token.MasterKey
	log     *slog.Logger
	mux     *http.ServeMux
	handler http.Handler // mux with JSON 404/405 answers
	workers *workerDirectory
	// heartbeat is the interval of SSE comments to browsers.
	heartbeat time.Duration
	// draining is closed when shutdown begins (BeginShutdown): /healthz
	// turns 503 and browser streams end, so browsers reconnect to another
	// replica, while gateway calls in flight go on.
	draining  chan struct{}
	drainOnce sync.Once
	// upstream checks that the model upstream resolves and answers, for
	// readiness and at start.
	upstream *upstreamCheck
	// slots caps browser streams and feeds together (limits.go).
	slots *streamSlots
	// relays are the browser streams taken over from the HTTP server
	// (sse.Conn), which it no longer waits for; Run waits for them.
	relays sync.WaitGroup
	// feeds share one worker subscription per conversation among the
	// browser streams (fanout.go); stopFeeds ends them all (BeginShutdown).
	feeds     *feeds
	stopFeeds context.CancelFunc
	// budget answers the user's own spend (GET /api/me).
	budget *budget.Service
	// prov is the K8sWorkerProvisioner when provisioning is on.
	prov atomic.Pointer[provision.K8sWorkerProvisioner]
}

// BeginShutdown turns the control plane unready and ends its browser
// streams cleanly (each with a comment saying why), so browsers reconnect
// with Last-Event-ID to another replica; the events live on the worker, so
// nothing is lost. Requests in flight (gateway calls, reports) are not
// touched: they finish while the HTTP server drains. It is idempotent.
func (s *Server) BeginShutdown() {
	s.drainOnce.Do(func() {
		s.log.Info("control plane shutting down: unready, browser streams ended, calls in flight finishing")
		close(s.draining)
		s.stopFeeds()
	})
}

// shuttingDown reports whether BeginShutdown was called.
func (s *Server) shuttingDown() bool {
	select {
	case <-s.draining:
		return true
	default:
		return false
	}
}

// errShuttingDown answers requests that would start long work (a browser
// stream) on a control plane that is shutting down.
func errShuttingDown() error {
	e := httpapi.Errorf(http.StatusServiceUnavailable, contract.ErrTypeUnavailable, "this control plane is shutting down; retry (another replica answers)")
	e.Header = http.Header{"Retry-After": {"1"}}
	return e
}

// workerDirectory finds and caches the client of each tenant-env's worker.
type workerDirectory struct {
	template string
	master   token.MasterKey
	// transport reaches every worker, its sockets counted in the
	// process's open-files budget.
	transport http.RoundTripper

	mu sync.Mutex
	// clients caches one client per "tenant/env"; guarded by mu.
	clients map[string]*workerclient.Client
}

func (d *workerDirectory) client(tenant, env string) (*workerclient.Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	key := tenant + "/" + env
	if c, ok := d.clients[key]; ok {
		return c, nil
	}
	raw := strings.NewReplacer("{tenant}", tenant, "{env}", env).Replace(d.template)
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	c := workerclient.NewWithTransport(u, tenant, env, d.master.Derive(token.PurposeWorkerRequest, tenant, env), d.transport)
	d.clients[key] = c
	return c, nil
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// user authenticates the browser request's bearer token.
func (s *Server) user(r *http.Request) (controlstore.User, error) {
	raw := httpapi.BearerToken(r)
	if raw == "" {
		return controlstore.User{}, httpapi.Unauthorized("missing bearer token (Authorization: Bearer <user token>)", nil)
	}
	u, err := s.db.UserByTokenHash(r.Context(), controlstore.HashUserToken(raw))
	if errors.Is(err, controlstore.ErrNotFound) {
		return controlstore.User{}, httpapi.Unauthorized("unknown user token", nil)
	}
	return u, err
}

// conversation loads conversation id for user u; another user's
// conversation is reported as not found.
func (s *Server) conversation(r *http.Request, u controlstore.User) (controlstore.Conversation, error) {
	id := r.PathValue("id")
	if contract.ValidConversationID(id) != nil {
		return controlstore.Conversation{}, httpapi.NotFound("conversation not found")
	}
	c, err := s.db.Conversation(r.Context(), id)
	if errors.Is(err, controlstore.ErrNotFound) || (err == nil && c.UserID != u.ID) {
		return controlstore.Conversation{}, httpapi.NotFound("conversation not found")
	}
	return c, err
}

// ownConversation authenticates the user, loads the conversation of the
// path (404 unless it is theirs) and returns it with its worker's client.
func (s *Server) ownConversation(r *http.Request) (controlstore.User, controlstore.Conversation, *workerclient.Client, error) {
	u, err := s.user(r)
	if err != nil {
		return u, controlstore.Conversation{}, nil, err
	}
	c, err := s.conversation(r, u)
	if err != nil {
		return u, c, nil, err
	}
	wc, err := s.workers.client(c.Tenant, c.Env)
	return u, c, wc, err
}

// workerError maps a worker client error to a browser API error.
func workerError(err error) error {
	var we *workerclient.Error
	switch {
	case errors.As(err, &we):
		switch {
		case we.Status == http.StatusUnauthorized || we.Status == http.StatusForbidden:
			// The control plane already checked the user; a refusal by the
			// worker is a platform fault (keys, clocks), not the user's.
			return httpapi.Wrap(http.StatusBadGateway, contract.ErrTypeUpstream, "the worker refused the control plane's request", err)
		case we.Status == http.StatusServiceUnavailable:
			return retryLater(httpapi.Wrap(http.StatusServiceUnavailable, contract.ErrTypeUnavailable, "the worker of this conversation is not taking new work: "+we.Msg, err))
		case we.Status >= 500:
			return httpapi.Wrap(http.StatusBadGateway, contract.ErrTypeUpstream, "worker: "+we.Msg, err)
		}
		return httpapi.Wrap(we.Status, we.Type, we.Msg, err)
	case httpapi.LocalExhaustion(err):
		return errWorkerLocal(err)
	case errors.Is(err, workerclient.ErrUnavailable):
		return retryLater(httpapi.Wrap(http.StatusServiceUnavailable, contract.ErrTypeUnavailable, "the worker of this conversation is unreachable; try again shortly", err))
	}
	return err
}

// retryLater adds Retry-After to a 503.
func retryLater(e *httpapi.Error) *httpapi.Error {
	e.Header = http.Header{"Retry-After": {"2"}}
	return e
}

// retryable reports whether a worker call may succeed if repeated: the
// worker was unreachable or answered 503 (restarting, shutting down).
func retryable(err error) bool {
	var we *workerclient.Error
	if httpapi.LocalExhaustion(err) {
		return false // this process's own: answered at once (workerError)
	}
	return errors.Is(err, workerclient.ErrUnavailable) || (errors.As(err, &we) && we.Status == http.StatusServiceUnavailable)
}

// retryUnavailable runs f until it succeeds, fails for good, or the worker
// stays unavailable for about 15 s (a restart or a rolling update).
func retryUnavailable(ctx context.Context, f func(ctx context.Context) error) error {
	deadline := time.Now().Add(15 * time.Second)
	delay := 100 * time.Millisecond
	for {
		err := f(ctx)
		if err == nil || !retryable(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
	}
}

type createConversationRequest struct {
	Tenant string `json:"tenant"`
	Env    string `json:"env"`
	Model  string `json:"model,omitempty"`
	// Sample names a sample project to start the working tree from.
	Sample string `json:"sample,omitempty"`
}

type conversationResponse struct {
	conversationJSON
	// Worker is the worker's view of the session, when it answered.
	Worker *contract.SessionStatus `json:"worker,omitempty"`
}

func (s *Server) createConversation(w http.ResponseWriter, r *http.Request) error {
	u, err := s.user(r)
	if err != nil {
		return err
	}
	body, err := httpapi.ReadBody(w, r, 16<<10)
	if err != nil {
		return err
	}
	var req createConversationRequest
	if err := httpapi.DecodeJSON(r, body, &req); err != nil {
		return err
	}
	if !validName(req.Tenant) || !validName(req.Env) {
		return httpapi.BadRequest("tenant and env must be 1-30 characters of [a-z0-9-]")
	}
	if req.Sample != "" && !validName(req.Sample) {
		return httpapi.BadRequest("sample must name a sample project, 1-30 characters of [a-z0-9-]")
	}
	ok, err := s.db.HasGrant(r.Context(), u.ID, req.Tenant, req.Env)
	if err != nil {
		return err
	}
	if !ok {
		return httpapi.Forbidden("you have no access to "+req.Tenant+"/"+req.Env, nil)
	}
	c := controlstore.Conversation{ID: uuid.NewString(), Tenant: req.Tenant, Env: req.Env, UserID: u.ID, Model: req.Model, CreatedAt: time.Now().UTC()}
	if err := s.storeConversation(r.Context(), c); err != nil {
		return err
	}
	// The session is created on the worker before the answer: a 201 means
	// the worker has it (with the requested model). When the worker refuses
	// or cannot be reached, the conversation is undone and the answer says
	// so (notCreatedOnWorker): the client retries the create.
	wc, err := s.workers.client(c.Tenant, c.Env)
	if err != nil {
		return s.notCreatedOnWorker(r.Context(), c, nil, err)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	st, err := wc.CreateSession(ctx, c.ID, contract.CreateSessionRequest{UserID: u.ID, Model: req.Model, Sample: req.Sample})
	cancel()
	if err != nil {
		return s.notCreatedOnWorker(r.Context(), c, wc, err)
	}
	resp := conversationResponse{conversationJSON: toConversationJSON(controlstore.ConversationSummary{Conversation: c, LastActivity: c.CreatedAt}), Worker: &st}
	httpapi.WriteJSON(w, http.StatusCreated, resp)
	return nil
}

func (s *Server) getConversation(w http.ResponseWriter, r *http.Request) error {
	_, c, wc, err := s.ownConversation(r)
	if err != nil {
		return err
	}
	sum, err := s.db.ConversationSummaryOf(r.Context(), c.ID)
	if errors.Is(err, controlstore.ErrNotFound) {
		return httpapi.NotFound("conversation not found")
	}
	if err != nil {
		return err
	}
	resp := conversationResponse{conversationJSON: toConversationJSON(sum)}
	st, err := wc.Status(r.Context(), c.ID)
	var we *workerclient.Error
	switch {
	case err == nil:
		resp.Worker = &st
	case errors.As(err, &we) && we.Status == http.StatusNotFound:
	default:
		return workerError(err)
	}
	httpapi.WriteJSON(w, http.StatusOK, resp)
	return nil
}

type sendMessageRequest struct {
	Text string `json:"text"`
	// ClientMessageID makes a retried send safe; generated when empty.
	ClientMessageID string `json:"client_message_id,omitempty"`
}

func (s *Server) sendMessage(w http.ResponseWriter, r *http.Request) error {
	u, c, wc, err := s.ownConversation(r)
	if err != nil {
		return err
	}
	body, err := httpapi.ReadBody(w, r, contract.MaxMessageBytes+16<<10)
	if err != nil {
		return err
	}
	var req sendMessageRequest
	if err := httpapi.DecodeJSON(r, body, &req); err != nil {
		return err
	}
	if strings.TrimSpace(req.Text) == "" {
		return httpapi.BadRequest("text must not be empty")
	}
	if len(req.Text) > contract.MaxMessageBytes {
		return httpapi.Errorf(http.StatusRequestEntityTooLarge, contract.ErrTypeTooLarge, "text over %d bytes", contract.MaxMessageBytes)
	}
	if req.ClientMessageID == "" {
		req.ClientMessageID = uuid.NewString()
	} else if contract.ValidConversationID(req.ClientMessageID) != nil {
		return httpapi.BadRequest("client_message_id must be 1-64 characters of [A-Za-z0-9_-]")
	}
	var resp contract.SendMessageResponse
	err = retryUnavailable(r.Context(), func(ctx context.Context) error {
		var err error
		resp, err = wc.SendMessage(ctx, c.ID, contract.SendMessageRequest{ClientMessageID: req.ClientMessageID, UserID: u.ID, Text: req.Text})
		var we *workerclient.Error
		if errors.As(err, &we) && we.Status == http.StatusNotFound {
			// The worker has no session (it was down at creation, or its
			// volume was replaced): create it with the stored model, resend.
			if _, err = wc.CreateSession(ctx, c.ID, contract.CreateSessionRequest{UserID: u.ID, Model: c.Model}); err != nil {
				return err
			}
			resp, err = wc.SendMessage(ctx, c.ID, contract.SendMessageRequest{ClientMessageID: req.ClientMessageID, UserID: u.ID, Text: req.Text})
		}
		return err
	})
	if err != nil {
		return workerError(err)
	}
	httpapi.WriteJSON(w, http.StatusAccepted, resp)
	return nil
}

// answerPermission relays the user's answer to a permission request of the
// agent (permission policy "ask").
func (s *Server) answerPermission(w http.ResponseWriter, r *http.Request) error {
	_, c, wc, err := s.ownConversation(r)
	if err != nil {
		return err
	}
	body, err := httpapi.ReadBody(w, r, 16<<10)
	if err != nil {
		return err
	}
	var a contract.PermissionAnswer
	if err := httpapi.DecodeJSON(r, body, &a); err != nil {
		return err
	}
	if a.Behavior != "allow" && a.Behavior != "deny" {
		return httpapi.BadRequest(`behavior must be "allow" or "deny"`)
	}
	if contract.ValidConversationID(r.PathValue("request_id")) != nil {
		return httpapi.NotFound("permission request not found")
	}
	var res contract.PermissionResolved
	err = retryUnavailable(r.Context(), func(ctx context.Context) error {
		var err error
		res, err = wc.AnswerPermission(ctx, c.ID, r.PathValue("request_id"), a)
		return err
	})
	if err != nil {
		return workerError(err)
	}
	httpapi.WriteJSON(w, http.StatusOK, res)
	return nil
}

func (s *Server) interrupt(w http.ResponseWriter, r *http.Request) error {
	_, c, wc, err := s.ownConversation(r)
	if err != nil {
		return err
	}
	resp, err := wc.Interrupt(r.Context(), c.ID)
	if err != nil {
		return workerError(err)
	}
	httpapi.WriteJSON(w, http.StatusAccepted, resp)
	return nil
}

// stream relays the worker's event stream to the browser, through the
// conversation's feed in this process (fanout.go): every browser stream of
// a conversation shares one worker subscription. It resumes after
// Last-Event-ID; a stream that joins behind what the feed keeps reads the
// worker on its own until it has caught up, then joins it. When the worker
// stream breaks (a worker restart) the feed reconnects from the last
// relayed id while the browsers stay connected, so each sees every event
// once, in order. A stream that falls a whole ring behind gets a moment
// (feedGrace) to move on, then is ended with a comment and resumes with
// Last-Event-ID.
func (s *Server) stream(w http.ResponseWriter, r *http.Request) error {
	_, c, wc, err := s.ownConversation(r)
	if err != nil {
		return err
	}
	if s.shuttingDown() {
		return errShuttingDown()
	}
	last := r.Header.Get(contract.HeaderLastEventID)
	if last == "" {
		last = r.URL.Query().Get("after")
	}
	after, err := sse.ParseID(last)
	if err != nil {
		return httpapi.BadRequest("%v", err)
	}
	if r.Method == http.MethodHead {
		sse.NewWriter(w)
		w.WriteHeader(http.StatusOK)
		return nil // the head only: nothing to follow
	}
	key := c.Tenant + "/" + c.Env + "/" + c.ID
	// The stream takes a slot; one that will open its conversation's feed
	// reserves the feed's too (join takes it over), so a refusal is a
	// proper 503 rather than a stream that ends at once.
	open, relayed := s.feeds.lookup(key, after)
	n := int64(1)
	if !open {
		n = 2
	}
	if !s.slots.take(n) {
		return errStreamLimit(s.slots.max)
	}
	// Without a feed that has relayed the resume point, open the worker
	// stream before answering, so a refusal (a resume point beyond the
	// newest event, a worker at its limit) becomes a proper HTTP error; a
	// feed opened for this stream takes it over.
	var es *workerclient.EventStream
	if !relayed {
		es, err = wc.Events(s.feeds.base, c.ID, after)
		var we *workerclient.Error
		switch {
		case errors.As(err, &we) && we.Status == http.StatusNotFound:
			es, err = nil, nil // no session yet: the feed waits for it
		case err != nil && httpapi.LocalExhaustion(err):
			// Out of open files here: a 200 would look healthy with
			// nothing behind it.
			s.slots.give(n)
			return errWorkerLocal(err)
		case err != nil && !errors.Is(err, workerclient.ErrUnavailable):
			s.slots.give(n)
			return workerError(err)
		}
	}
	// Join the conversation's feed before answering, so a stream opened
	// right after this one finds it open (and shares it), and a feed
	// without a free slot is a proper 503. From here the stream holds one
	// slot (release).
	v, f := s.feeds.join(key, c.ID, wc, after, es, !open)
	release := func() { s.slots.give(1) }
	if f == nil {
		release()
		return errStreamLimit(s.slots.max)
	}
	leave := func() {
		if v != nil {
			f.leave(v)
		}
	}
	hello := "talkide conversation " + c.ID
	// Take the connection over from the HTTP server where it can be (an
	// HTTP/1.x request): the stream then holds only its socket and one
	// small goroutine, not the server's buffers and request (sse.Conn).
	// It lives on after this handler returns, until the browser hangs up
	// (seen at once: sse.Conn.Gone) or stops reading (its write times
	// out), the feed cuts it, or shutdown.
	s.relays.Add(1) // before the server forgets the connection (Run waits)
	if conn, err := sse.Hijack(w, r, streamWriteTimeout); err == nil {
		go func() {
			defer s.relays.Done()
			defer release()
			defer conn.Close()
			defer func() {
				// Out of net/http's reach: a panic here would end the
				// process, not the one stream.
				if p := recover(); p != nil {
					s.log.Error("browser stream panicked", "conversation", c.ID, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				}
			}()
			if conn.WriteComment(hello) == nil {
				s.relay(conn.Context(), conn, key, c.ID, wc, after, v, f)
			} else {
				leave()
			}
		}()
		return nil
	} else if !errors.Is(err, sse.ErrCannotHijack) {
		s.relays.Done()
		release()
		leave()
		return nil // the browser is gone
	}
	s.relays.Done()
	defer release()
	sw := sse.NewWriter(w)
	w.WriteHeader(http.StatusOK)
	if err := sw.WriteComment(hello); err != nil {
		leave()
		return nil
	}
	s.relay(r.Context(), sw, key, c.ID, wc, after, v, f)
	return nil
}

// errNoFeedSlot ends a stream whose feed could not open (this process at
// its limit of streams and feeds).
const errNoFeedSlot = "this control plane serves its limit of browser streams and conversations watched; reconnect with Last-Event-ID (another replica may answer)"

// streamWriteTimeout bounds one write to a browser stream: a browser that
// takes nothing for this long is cut (it resumes with Last-Event-ID).
const streamWriteTimeout = 30 * time.Second

// streamSink is where a browser stream's frames go: sse.Conn (a
// connection taken over) or sse.Writer (an HTTP/2 response).
type streamSink interface {
	WriteFrames(frames [][]byte) error
	WriteComment(text string) error
}

// relay writes what the conversation's feed relays to the browser stream
// of viewer v (joined by stream; nil when it is behind what the feed
// keeps: it catches up on its own first, then joins), in batches, with a
// heartbeat comment when idle, until the browser leaves (a write fails, or
// ctx ends: the request's, or sse.Conn's when the browser hangs up), the
// feed cuts or ends it, or shutdown begins.
func (s *Server) relay(ctx context.Context, sink streamSink, key, conv string, wc *workerclient.Client, after int64, v *viewer, f *feed) {
	if v == nil {
		if v, f = s.catchUp(ctx, sink, key, conv, wc, after); v == nil {
			return
		}
	}
	defer f.leave(v)
	tick := time.NewTicker(s.heartbeat)
	defer tick.Stop()
	var batch []*frame
	var bufs [][]byte
	for {
		select {
		case <-v.wake:
			// A batch short of viewerBatch took all there was: a frame
			// published since signalled wake again, so it is not missed.
			for more := true; more; {
				batch = f.next(v, batch)
				more = len(batch) == viewerBatch
				bufs = bufs[:0]
				for _, fr := range batch {
					bufs = append(bufs, fr.bytes)
				}
				var err error
				if len(bufs) > 0 {
					err = sink.WriteFrames(bufs)
				}
				clear(batch) // hold no frame the ring has dropped
				clear(bufs)
				if err != nil {
					return // browser gone
				}
			}
			batch, bufs = nil, nil // an idle stream holds no batch
		case <-v.gone:
			_ = sink.WriteComment(v.why)
			return
		case <-tick.C:
			if err := sink.WriteComment("heartbeat"); err != nil {
				return
			}
		case <-s.draining:
			// End the response cleanly: the browser reconnects with the
			// id of the last event it got, to a replica still serving.
			_ = sink.WriteComment("control plane shutting down; reconnect with Last-Event-ID")
			return
		case <-ctx.Done():
			return
		}
	}
}

// catchUp relays the worker's events after the id after to sw on a
// stream of its own, until the conversation's feed keeps them (or is at
// them) and the browser stream can join it; it returns the viewer and its
// feed, or nil when the stream is over (the browser gone, the conversation
// deleted, the feed ended, this process out of open files, shutdown).
func (s *Server) catchUp(ctx context.Context, sw streamSink, key, conv string, wc *workerclient.Client, after int64) (*viewer, *feed) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.feeds.base, cancel)() // shutdown
	var v *viewer
	var f *feed
	followWorker(ctx, s.log, wc, conv, after, nil, s.deletedMeanwhile, func(ev contract.Event) bool {
		b, err := sse.JSONFrame(strconv.FormatInt(ev.ID, 10), string(ev.Type), ev)
		if err != nil {
			s.log.Warn("worker event not relayed: it cannot be framed", "conversation", conv, "id", ev.ID, "err", err)
			return true
		}
		if sw.WriteFrames([][]byte{b}) != nil {
			return false
		}
		v, f = s.feeds.join(key, conv, wc, ev.ID, nil, false)
		if f == nil {
			_ = sw.WriteComment(errNoFeedSlot)
			return false
		}
		return v == nil && !f.isEnded()
	})
	if v == nil {
		return nil, nil
	}
	return v, f
}

// readyz is readiness as Kubernetes uses it: can this replica serve? Its
// database answers and it is not shutting down. What every replica shares
// (the model upstream, the workers) is left to /healthz: failing readiness
// on it would take every replica out of the Service at once, the browser
// API, the mint and the workers' reports with them, and stall rollouts.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	if err := s.serving(ctx); err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// serving checks what this replica needs to serve: not shutting down, its
// database answering.
func (s *Server) serving(ctx context.Context) error {
	if s.shuttingDown() {
		return errShuttingDown()
	}
	if err := s.db.SQL.PingContext(ctx); err != nil {
		return httpapi.Wrap(http.StatusServiceUnavailable, contract.ErrTypeUnavailable, "database unavailable", err)
	}
	return nil
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	if err := s.serving(ctx); err != nil {
		return err
	}
	for _, te := range s.cfg.HealthWorkers {
		wc, err := s.workers.client(te[0], te[1])
		if err != nil {
			return err
		}
		if err := wc.Ready(ctx); err != nil {
			return httpapi.Wrap(http.StatusServiceUnavailable, contract.ErrTypeUnavailable, "worker "+te[0]+"/"+te[1]+" not ready", err)
		}
	}
	// Model calls fail while the upstream cannot be reached: say so, with
	// the cause (a *gateway.UpstreamError), rather than look ready.
	if err := s.upstream.result(r.Context()); err != nil {
		return httpapi.Wrap(http.StatusServiceUnavailable, contract.ErrTypeUnavailable, err.Error(), err)
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}
