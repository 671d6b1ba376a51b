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

	"github.com/talkide/talkide/internal/contract"
)

// TestRequestIDsAdoptedOnlyAfterAuthentication: every request gets a new
// id; the one its caller sent replaces it only when a handler adopts it
// (after checking the caller's credential) and it is well formed. Lines
// logged before adoption carry the new id; the access-log line, written
// at the end, carries the adopted one.
func TestRequestIDsAdoptedOnlyAfterAuthentication(t *testing.T) {
	var buf bytes.Buffer
	log := WithRequestIDs(slog.New(slog.NewJSONHandler(&buf, nil)))
	var before, after string
	mux := http.NewServeMux()
	mux.HandleFunc("POST /internal", func(w http.ResponseWriter, r *http.Request) {
		before = RequestID(r.Context())
		log.InfoContext(r.Context(), "before the credential check")
		after = AdoptRequestID(w, r) // the caller's credential checked out
	})
	mux.HandleFunc("POST /browser", func(w http.ResponseWriter, r *http.Request) {
		before = RequestID(r.Context())
		after = before
	})
	h := RequestIDs(Routes(mux, log))
	for _, tc := range []struct {
		path, sent string
		adopted    bool
	}{
		{"/internal", "req_from_the_worker", true},
		{"/internal", "", false},
		{"/internal", "bad id with spaces", false},
		{"/internal", strings.Repeat("x", 65), false},
		{"/internal", "evil\r\nX-Injected: 1", false},
		{"/browser", "req_chosen_by_a_browser", false},
	} {
		buf.Reset()
		r := httptest.NewRequest("POST", tc.path, nil)
		if tc.sent != "" {
			r.Header[HeaderRequestID] = []string{tc.sent}
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if !strings.HasPrefix(before, "req_") || before == tc.sent {
			t.Errorf("%s %q: id before adoption %q, want a new one", tc.path, tc.sent, before)
		}
		if got := w.Header().Get(HeaderRequestID); got != after {
			t.Errorf("%s %q: answered %q, handler's id %q", tc.path, tc.sent, got, after)
		}
		if (after == tc.sent) != tc.adopted {
			t.Errorf("%s %q: id %q, adopted want %v", tc.path, tc.sent, after, tc.adopted)
		}
		if tc.adopted && (!strings.Contains(buf.String(), `"msg":"request","method":"POST","path":"/internal","status":200`) ||
			!strings.Contains(buf.String(), `"request_id":"`+tc.sent+`"`) || !strings.Contains(buf.String(), `"request_id":"`+before+`"`)) {
			t.Errorf("%s %q: log %s: want the early line under the new id and the access line under the adopted one", tc.path, tc.sent, buf.String())
		}
	}
	if a, b := NewRequestID(), NewRequestID(); a == b || len(a) != 24 {
		t.Errorf("ids %q %q", a, b)
	}
}

// TestErrorsAndPanicsCarryTheRequestID: an error body names the request id,
// and the log lines about the request carry it; a panic is a 500 in the
// documented shape with one log line, not a dropped connection.
func TestErrorsAndPanicsCarryTheRequestID(t *testing.T) {
	var buf bytes.Buffer
	log := WithRequestIDs(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	mux := http.NewServeMux()
	mux.Handle("GET /fail", Handle(log, func(w http.ResponseWriter, r *http.Request) error {
		return Wrap(http.StatusConflict, contract.ErrTypeConflict, "safe message", errors.New("internal cause /var/lib/secret"))
	}))
	mux.HandleFunc("GET /panic", func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	srv := httptest.NewServer(RequestIDs(Routes(mux, log)))
	defer srv.Close()
	for _, tc := range []struct {
		path   string
		status int
		typ    string
	}{{"/fail", 409, contract.ErrTypeConflict}, {"/panic", 500, contract.ErrTypeInternal}, {"/nowhere", 404, contract.ErrTypeNotFound}} {
		buf.Reset()
		resp, err := http.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatalf("%s: %v (a panic must not drop the connection)", tc.path, err)
		}
		var body contract.ErrorBody
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		id := resp.Header.Get(HeaderRequestID)
		if resp.StatusCode != tc.status || body.Error.Type != tc.typ || id == "" || body.Error.RequestID != id {
			t.Fatalf("%s: %d %+v, header id %q", tc.path, resp.StatusCode, body, id)
		}
		if strings.Contains(body.Error.Message, "secret") || strings.Contains(body.Error.Message, "boom") {
			t.Errorf("%s: internal text reached the client: %q", tc.path, body.Error.Message)
		}
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		for _, l := range lines {
			if !strings.Contains(l, `"request_id":"`+id+`"`) {
				t.Errorf("%s: a log line without the request id: %s", tc.path, l)
			}
		}
		if len(lines) < 2 { // the failure (or panic) and the request line
			t.Errorf("%s: log %q", tc.path, buf.String())
		}
	}
}
