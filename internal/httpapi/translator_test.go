package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
)

// TestAnthropicBody: the Anthropic family's answer is Anthropic's error
// envelope with the request id in the request-id header, the body and at
// the end of the message (which is all Claude Code shows), the details and
// headers of the error, and the family's type for a platform one.
func TestAnthropicBody(t *testing.T) {
	r := httptest.NewRequest("POST", "/v1/messages", nil)
	r = r.WithContext(WithRequestID(r.Context(), "req_1"))
	rec := httptest.NewRecorder()
	AnthropicBody(rec, r, &Error{Status: http.StatusTooManyRequests, Type: anthropic.ErrRateLimit, Msg: "budget exhausted",
		Header: http.Header{"Retry-After": {"60"}}, Details: map[string]any{"error_code": "budget_exceeded"}})
	want := `{"type":"error","error":{"type":"rate_limit_error","message":"budget exhausted (request req_1)","details":{"error_code":"budget_exceeded"}},"request_id":"req_1"}`
	if got := strings.TrimSpace(rec.Body.String()); got != want || rec.Code != 429 || rec.Header().Get("request-id") != "req_1" ||
		rec.Header().Get("Retry-After") != "60" || rec.Header().Get("Content-Type") != "application/json" {
		t.Errorf("got %d %v %q, want 429 %q", rec.Code, rec.Header(), got, want)
	}

	for _, tc := range []struct {
		status   int
		typ      string
		wantType string
	}{
		{413, contract.ErrTypeTooLarge, anthropic.ErrTooLarge},
		{400, contract.ErrTypeInvalidRequest, anthropic.ErrInvalidRequest},
		{405, contract.ErrTypeMethod, anthropic.ErrInvalidRequest},
		{404, contract.ErrTypeNotFound, anthropic.ErrNotFound},
		{500, contract.ErrTypeInternal, anthropic.ErrAPI},
		{503, anthropic.ErrAPI, anthropic.ErrAPI},
		{504, "", anthropic.ErrTimeout},
		{403, anthropic.ErrPermission, anthropic.ErrPermission},
	} {
		if got := AnthropicType(tc.status, tc.typ); got != tc.wantType {
			t.Errorf("AnthropicType(%d, %q) = %q, want %q", tc.status, tc.typ, got, tc.wantType)
		}
	}
}

// TestTranslatorOneErrorPath: every way a route of a family can fail (an
// error it returns, a cause that is no *Error, a panic, an unknown path, a
// wrong method) answers in that family's shape, and the cause reaches the
// log once and the client never.
func TestTranslatorOneErrorPath(t *testing.T) {
	const secret = "open /var/lib/talkide/db: permission denied"
	for _, fam := range []struct {
		name string
		body ErrorBody
		// typeOf reads the error type from a body, or "" when the body
		// is not the family's shape.
		typeOf func(b []byte, id string) string
	}{
		{"platform", nil, func(b []byte, id string) string {
			var e contract.ErrorBody
			if json.Unmarshal(b, &e) != nil || e.Error.RequestID != id {
				return ""
			}
			return e.Error.Type
		}},
		{"anthropic", AnthropicBody, func(b []byte, id string) string {
			var e anthropic.ErrorEnvelope
			if json.Unmarshal(b, &e) != nil || e.Type != "error" || e.RequestID != id || !strings.HasSuffix(e.Error.Message, "(request "+id+")") {
				return ""
			}
			return e.Error.Type
		}},
	} {
		t.Run(fam.name, func(t *testing.T) {
			var logs bytes.Buffer
			tr := Translator{Log: slog.New(slog.NewJSONHandler(&logs, nil)), Body: fam.body}
			mux := http.NewServeMux()
			mux.Handle("POST /fail", tr.Handle(func(w http.ResponseWriter, r *http.Request) error {
				return Wrap(http.StatusConflict, contract.ErrTypeConflict, "busy", errors.New(secret))
			}))
			mux.Handle("POST /cause", tr.Handle(func(w http.ResponseWriter, r *http.Request) error { return errors.New(secret) }))
			mux.HandleFunc("POST /panic", func(w http.ResponseWriter, r *http.Request) { panic(secret) })
			h := RequestIDs(tr.Routes(mux))
			wantType := func(status int, platform string) string {
				if fam.body == nil {
					return platform
				}
				return AnthropicType(status, platform)
			}
			for _, tc := range []struct {
				method, path string
				status       int
				typ          string
				causeLogged  bool
			}{
				{"POST", "/fail", 409, contract.ErrTypeConflict, true},
				{"POST", "/cause", 500, contract.ErrTypeInternal, true},
				{"POST", "/panic", 500, contract.ErrTypeInternal, true},
				{"POST", "/nowhere", 404, contract.ErrTypeNotFound, false},
				{"GET", "/fail", 405, contract.ErrTypeMethod, false},
			} {
				logs.Reset()
				req := httptest.NewRequest(tc.method, tc.path, nil)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				id := rec.Header().Get(HeaderRequestID)
				if rec.Code != tc.status || id == "" || fam.typeOf(rec.Body.Bytes(), id) != wantType(tc.status, tc.typ) {
					t.Errorf("%s %s: got %d %s, want %d of type %s in the %s shape", tc.method, tc.path, rec.Code, rec.Body, tc.status, wantType(tc.status, tc.typ), fam.name)
				}
				if strings.Contains(rec.Body.String(), "permission denied") {
					t.Errorf("%s %s: the cause reached the client: %s", tc.method, tc.path, rec.Body)
				}
				if n := strings.Count(logs.String(), "permission denied"); tc.causeLogged && n != 1 {
					t.Errorf("%s %s: the cause is logged %d times, want once:\n%s", tc.method, tc.path, n, logs.String())
				}
			}
		})
	}
}
