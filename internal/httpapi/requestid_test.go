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

func TestRequestIDsKeepOnlyTrustedWellFormedIDs(t *testing.T) {
	var seen string
	h := RequestIDs(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = RequestID(r.Context()) }),
		func(r *http.Request) bool { return r.URL.Path == "/internal" })
	for _, tc := range []struct {
		path, sent string
		kept       bool
	}{
		{"/internal", "req_from_the_worker", true},
		{"/internal", "", false},
		{"/internal", "bad id with spaces", false},
		{"/internal", strings.Repeat("x", 65), false},
		{"/internal", "evil\r\nX-Injected: 1", false},
		{"/browser", "req_chosen_by_a_browser", false},
	} {
		r := httptest.NewRequest("GET", tc.path, nil)
		if tc.sent != "" {
			r.Header[HeaderRequestID] = []string{tc.sent}
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if got := w.Header().Get(HeaderRequestID); got != seen || seen == "" {
			t.Fatalf("%s %q: answered %q, handler saw %q", tc.path, tc.sent, got, seen)
		}
		if (seen == tc.sent) != tc.kept {
			t.Errorf("%s %q: id %q, kept want %v", tc.path, tc.sent, seen, tc.kept)
		}
		if !tc.kept && !strings.HasPrefix(seen, "req_") {
			t.Errorf("made id %q", seen)
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
	srv := httptest.NewServer(RequestIDs(Routes(mux, log), nil))
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
