package devupstream

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a [Server]. The zero value is a usable development
// server: any credential accepted, [DemoResponder], no logs, no admin API.
type Config struct {
	// APIKey, when non-empty, is the credential every /v1/ call must carry,
	// as "x-api-key: <APIKey>" or "Authorization: Bearer <APIKey>";
	// anything else gets 401 authentication_error. Empty accepts any
	// credential or none.
	APIKey string
	// Responder answers calls that no scripted response is queued for.
	// Nil means DemoResponder{}.
	Responder Responder
	// Logger gets one line per request. Nil discards logs.
	Logger *slog.Logger
	// EnableAdmin serves the /_dev/ admin API (see the package doc).
	EnableAdmin bool
	// MaxRecorded bounds how many requests Requests keeps (the oldest are
	// dropped first). Zero means 100; negative records nothing.
	MaxRecorded int
}

// defaultMaxRecorded bounds the recorder when Config.MaxRecorded is zero;
// CLI request bodies run to hundreds of KB, so keep it modest.
const defaultMaxRecorded = 100

// RecordedRequest is one request as received, for test assertions.
type RecordedRequest struct {
	Method string
	Path   string
	Query  string      // raw query, e.g. "beta=true"
	Header http.Header // all headers, credentials included
	Body   []byte      // nil when the body was too large or unreadable
}

// recordedJSON is the admin-API form of a RecordedRequest: the body as
// text rather than base64.
type recordedJSON struct {
	Method string      `json:"method"`
	Path   string      `json:"path"`
	Query  string      `json:"query"`
	Header http.Header `json:"header"`
	Body   string      `json:"body"`
}

// MarshalJSON encodes the admin-API form, body as text.
func (r RecordedRequest) MarshalJSON() ([]byte, error) {
	return json.Marshal(recordedJSON{Method: r.Method, Path: r.Path, Query: r.Query, Header: r.Header, Body: string(r.Body)})
}

// UnmarshalJSON decodes the admin-API form.
func (r *RecordedRequest) UnmarshalJSON(data []byte) error {
	var j recordedJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*r = RecordedRequest{Method: j.Method, Path: j.Path, Query: j.Query, Header: j.Header}
	if j.Body != "" {
		r.Body = []byte(j.Body)
	}
	return nil
}

// Server is the development upstream, an [http.Handler] mounted at the
// root; see the package documentation for its endpoints. Streaming answers
// follow "Anthropic Messages streaming events"; errors use Anthropic's
// error envelope. It is safe for concurrent use.
type Server struct {
	apiKey      string
	responder   Responder
	log         *slog.Logger
	admin       bool
	maxRecorded int

	ids atomic.Uint64 // counter part of generated ids

	// mu guards script and recorded.
	mu       sync.Mutex
	script   []Response
	recorded []RecordedRequest
}

var _ http.Handler = (*Server)(nil)

// New returns a Server for cfg, with the defaults documented on [Config].
func New(cfg Config) *Server {
	s := &Server{
		apiKey:      cfg.APIKey,
		responder:   cfg.Responder,
		log:         cfg.Logger,
		admin:       cfg.EnableAdmin,
		maxRecorded: cfg.MaxRecorded,
	}
	if s.responder == nil {
		s.responder = DemoResponder{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.maxRecorded == 0 {
		s.maxRecorded = defaultMaxRecorded
	}
	return s
}

// Script queues responses for the next POST /v1/messages calls, used
// first-in first-out before the responder is asked. Calls rejected before
// they reach the responder (400, 401, 413) do not consume them.
func (s *Server) Script(rs ...Response) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = append(s.script, rs...)
}

// Requests returns copies of the recorded requests, oldest first: every
// request except the admin API's, whatever its outcome.
func (s *Server) Requests() []RecordedRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]RecordedRequest, len(s.recorded))
	for i, r := range s.recorded {
		r.Header = r.Header.Clone()
		r.Body = bytes.Clone(r.Body)
		out[i] = r
	}
	return out
}

// Reset drops the scripted responses not used yet and the recorded
// requests.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = nil
	s.recorded = nil
}

// nextScripted pops the oldest scripted response.
func (s *Server) nextScripted() (Response, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.script) == 0 {
		return Response{}, false
	}
	r := s.script[0]
	s.script = s.script[1:]
	return r, true
}

func (s *Server) record(r *http.Request, body []byte) {
	if s.maxRecorded < 0 {
		return
	}
	rec := RecordedRequest{
		Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
		Header: r.Header.Clone(), Body: body,
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.recorded) >= s.maxRecorded {
		s.recorded = append(s.recorded[:0:0], s.recorded[len(s.recorded)-s.maxRecorded+1:]...)
	}
	s.recorded = append(s.recorded, rec)
}

// newID returns prefix + a 6-digit counter + 8 random hex digits, e.g.
// "req_dev_000042a1b2c3d4": ordered within a run, unique across runs.
func (s *Server) newID(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return fmt.Sprintf("%s%06d%s", prefix, s.ids.Add(1), hex.EncodeToString(b[:]))
}

// statusWriter remembers the status for the log line; Unwrap lets
// http.ResponseController reach the Flusher underneath.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// call is the per-request state handlers share.
type call struct {
	requestID string
	model     string // for the log line, once known
}

// handlerFunc serves one route. It returns an error instead of writing
// one; ServeHTTP translates it (see serveError).
type handlerFunc func(w http.ResponseWriter, r *http.Request, c *call) error

// ServeHTTP routes the request, sets the request-id header on every
// answer and writes every error in Anthropic's envelope.
func (s *Server) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	c := &call{requestID: s.newID("req_dev_")}
	w := &statusWriter{ResponseWriter: rw}
	w.Header().Set("request-id", c.requestID)

	err := s.route(r)(w, r, c)
	if err != nil && w.status == 0 {
		s.serveError(w, c, err)
	}

	status := w.status
	if err != nil && r.Context().Err() != nil {
		status = 499 // the client went away mid-answer; not our failure
	}
	attrs := []any{
		"method", r.Method, "path", r.URL.Path, "status", status,
		"request_id", c.requestID, "duration_ms", time.Since(start).Milliseconds(),
	}
	if c.model != "" {
		attrs = append(attrs, "model", c.model)
	}
	if sid := r.Header.Get("X-Claude-Code-Session-Id"); sid != "" {
		attrs = append(attrs, "session", sid)
	}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	s.log.Info("handled request", attrs...)
}

// serveError writes err in the envelope: an *APIError as is, anything
// else as 500 api_error with a generic message (the cause goes to the log).
func (s *Server) serveError(w http.ResponseWriter, c *call, err error) {
	ae, ok := errors.AsType[*APIError](err)
	if !ok {
		ae = &APIError{Status: http.StatusInternalServerError, Type: "api_error", Message: "Internal server error"}
	}
	writeAPIError(w, ae, c.requestID)
}

// route picks the handler for r; unknown paths and wrong methods get
// handlers that return 404 and 405.
func (s *Server) route(r *http.Request) handlerFunc {
	type route struct {
		methods []string
		h       handlerFunc
	}
	var rt route
	switch path := r.URL.Path; {
	case path == "/v1/messages":
		rt = route{[]string{http.MethodPost}, s.handleMessages}
	case path == "/v1/messages/count_tokens":
		rt = route{[]string{http.MethodPost}, s.handleCountTokens}
	case path == "/v1/models":
		rt = route{[]string{http.MethodGet}, s.handleModels}
	case path == "/api/hello":
		rt = route{[]string{http.MethodGet, http.MethodHead}, s.handleHello}
	case s.admin && path == "/_dev/script":
		rt = route{[]string{http.MethodPost}, s.handleAdminScript}
	case s.admin && path == "/_dev/requests":
		rt = route{[]string{http.MethodGet}, s.handleAdminRequests}
	case s.admin && path == "/_dev/reset":
		rt = route{[]string{http.MethodPost}, s.handleAdminReset}
	default:
		return func(w http.ResponseWriter, r *http.Request, c *call) error {
			s.record(r, nil)
			return &APIError{Status: http.StatusNotFound, Type: "not_found_error", Message: "Not found: " + r.Method + " " + r.URL.Path}
		}
	}
	for _, m := range rt.methods {
		if r.Method == m {
			return rt.h
		}
	}
	return func(w http.ResponseWriter, r *http.Request, c *call) error {
		if !strings.HasPrefix(r.URL.Path, "/_dev/") {
			s.record(r, nil)
		}
		w.Header().Set("Allow", strings.Join(rt.methods, ", "))
		return &APIError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error",
			Message: "Method " + r.Method + " not allowed for " + r.URL.Path}
	}
}

// readBody reads the whole body, bounded by MaxBodyBytes; too large is
// 413 request_too_large.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	tooLarge := &APIError{Status: http.StatusRequestEntityTooLarge, Type: "request_too_large",
		Message: "Request exceeds the maximum allowed number of bytes (" + strconv.Itoa(MaxBodyBytes) + ")."}
	if r.ContentLength > MaxBodyBytes {
		return nil, tooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, tooLarge
		}
		return nil, fmt.Errorf("read request body: %w", err)
	}
	return body, nil
}

// authorize checks the credential of a /v1/ call against Config.APIKey.
func (s *Server) authorize(r *http.Request) error {
	if s.apiKey == "" {
		return nil
	}
	key := []byte(s.apiKey)
	if k := r.Header.Get("X-Api-Key"); k != "" && subtle.ConstantTimeCompare([]byte(k), key) == 1 {
		return nil
	}
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok &&
		subtle.ConstantTimeCompare([]byte(tok), key) == 1 {
		return nil
	}
	return &APIError{Status: http.StatusUnauthorized, Type: "authentication_error", Message: "invalid x-api-key"}
}

// readCall reads, records and authorizes a /v1/ call and parses its body.
func (s *Server) readCall(w http.ResponseWriter, r *http.Request, c *call, needMaxTokens bool) (*Request, error) {
	body, err := readBody(w, r)
	s.record(r, body)
	if err != nil {
		return nil, err
	}
	if err := s.authorize(r); err != nil {
		return nil, err
	}
	req, err := parseRequest(body, needMaxTokens)
	if err != nil {
		return nil, err
	}
	req.Method, req.Path, req.Query, req.Header = r.Method, r.URL.Path, r.URL.Query(), r.Header.Clone()
	c.model = req.Model
	return req, nil
}

func (s *Server) handleHello(w http.ResponseWriter, r *http.Request, c *call) error {
	s.record(r, nil)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = io.WriteString(w, "{}")
	}
	return nil
}

func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request, c *call) error {
	req, err := s.readCall(w, r, c, false)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, map[string]int{"input_tokens": req.InputTokens})
}

// handleModels lists the one model the server answers as, in the shape of
// Anthropic's GET /v1/models (the control plane lists models to check its
// API key: 401 authentication_error for a wrong one).
func (s *Server) handleModels(w http.ResponseWriter, r *http.Request, c *call) error {
	s.record(r, nil)
	if err := s.authorize(r); err != nil {
		return err
	}
	type model struct {
		Type        string `json:"type"`
		ID          string `json:"id"`
		DisplayName string `json:"display_name"`
		CreatedAt   string `json:"created_at"`
	}
	return writeJSON(w, http.StatusOK, map[string]any{
		"data":     []model{{Type: "model", ID: ModelID, DisplayName: "TalkIDE development upstream", CreatedAt: "2026-01-01T00:00:00Z"}},
		"has_more": false, "first_id": ModelID, "last_id": ModelID,
	})
}

func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request, c *call) error {
	req, err := s.readCall(w, r, c, true)
	if err != nil {
		return err
	}
	resp, ok := s.nextScripted()
	if !ok {
		resp = s.responder.Respond(req)
		if resp.Model == "" {
			resp.Model = ModelID // priced as the development upstream, not as what was asked for
		}
	}
	return s.answer(w, r, c, req, resp)
}

// answer writes resp: delay, then an HTTP error, a non-streaming Message
// or an SSE stream, with the faults it asks for.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, c *call, req *Request, resp Response) error {
	ctx := r.Context()
	if err := sleep(ctx, resp.FirstByteDelay); err != nil {
		return err
	}
	if resp.Error != nil {
		return resp.Error
	}
	m, err := buildMessage(req, resp, s.newID)
	if err != nil {
		return fmt.Errorf("build answer: %w", err)
	}
	if !req.Stream {
		return s.answerWhole(w, c, m, resp)
	}
	evs, err := m.events()
	if err != nil {
		return err
	}

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		return fmt.Errorf("flush headers: %w", err)
	}

	// The fault fires after stop events; len(evs)+1 means never.
	stop, cut := len(evs)+1, false
	if se := resp.StreamError; se != nil {
		stop = min(max(se.AfterEvents, 0), len(evs))
	}
	if resp.Cut != nil {
		if n := min(max(resp.Cut.AfterEvents, 0), len(evs)); n < stop {
			stop, cut = n, true
		}
	}
	for i := 0; i <= len(evs); i++ {
		if i == stop {
			if cut {
				s.log.Info("cutting connection as scripted", "request_id", c.requestID, "after_events", i)
				// ErrAbortHandler makes net/http drop the connection
				// without the terminating chunk and without logging a
				// stack trace: the client sees a broken stream.
				panic(http.ErrAbortHandler)
			}
			se := resp.StreamError
			data, err := marshal(errorBody{Type: "error", Error: errorDetail{
				Type: cmp.Or(se.Type, "overloaded_error"), Message: cmp.Or(se.Message, "Overloaded"),
			}})
			if err != nil {
				return err
			}
			return writeEvent(rc, w, event{name: "error", data: data})
		}
		if i == len(evs) {
			break
		}
		if i > 0 {
			if err := sleep(ctx, resp.EventDelay); err != nil {
				return err
			}
		}
		if err := writeEvent(rc, w, evs[i]); err != nil {
			return err
		}
	}
	return nil
}

// answerWhole writes a non-streaming answer. A StreamError becomes the
// matching HTTP error; a Cut drops the connection before any byte.
func (s *Server) answerWhole(w http.ResponseWriter, c *call, m *message, resp Response) error {
	if resp.Cut != nil {
		s.log.Info("cutting connection as scripted", "request_id", c.requestID, "after_events", 0)
		panic(http.ErrAbortHandler) // see answer
	}
	if se := resp.StreamError; se != nil {
		return &APIError{Type: cmp.Or(se.Type, "overloaded_error"), Message: cmp.Or(se.Message, "Overloaded")}
	}
	body, err := m.nonStreamingJSON()
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, err = w.Write(body)
	return err
}

// writeEvent writes one SSE event and flushes it.
func writeEvent(rc *http.ResponseController, w io.Writer, ev event) error {
	if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.name, ev.data); err != nil {
		return fmt.Errorf("write %s event: %w", ev.name, err)
	}
	if err := rc.Flush(); err != nil {
		return fmt.Errorf("flush %s event: %w", ev.name, err)
	}
	return nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	body, err := marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, err = w.Write(body)
	return err
}

func (s *Server) handleAdminScript(w http.ResponseWriter, r *http.Request, c *call) error {
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	var rs []Response
	if err := json.Unmarshal(body, &rs); err != nil {
		return invalidRequest("script: want a JSON array of responses: " + err.Error())
	}
	s.mu.Lock()
	s.script = append(s.script, rs...)
	n := len(s.script)
	s.mu.Unlock()
	return writeJSON(w, http.StatusOK, map[string]int{"queued": n})
}

func (s *Server) handleAdminRequests(w http.ResponseWriter, r *http.Request, c *call) error {
	return writeJSON(w, http.StatusOK, s.Requests())
}

func (s *Server) handleAdminReset(w http.ResponseWriter, r *http.Request, c *call) error {
	s.Reset()
	w.WriteHeader(http.StatusNoContent)
	return nil
}
