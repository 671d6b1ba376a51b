package httpapi

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestJoinURLLeadingSlash guards against url.JoinPath's relative result for
// a base without a path, which made every gateway call fail with a reset.
func TestJoinURLLeadingSlash(t *testing.T) {
	for base, want := range map[string]string{
		"http://h:1":      "/api/x/v1",
		"http://h:1/":     "/api/x/v1",
		"http://h:1/pre":  "/pre/api/x/v1",
		"http://h:1/pre/": "/pre/api/x/v1",
	} {
		u, _ := url.Parse(base)
		if got := JoinURL(u, "/api/x", "v1"); got.Path != want || got.RequestURI() != want {
			t.Errorf("JoinURL(%q): got path %q uri %q, want %q", base, got.Path, got.RequestURI(), want)
		}
	}
}

func TestWriteErrorShape(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	cases := []struct {
		err        error
		wantStatus int
		wantBody   string
	}{
		{NotFound("conversation %s not found", "c1"), 404, `{"error":{"type":"not_found","message":"conversation c1 not found"}}`},
		{errors.New("db exploded: secret detail"), 500, `{"error":{"type":"internal_error","message":"internal error"}}`},
	}
	for _, tc := range cases {
		rec := httptest.NewRecorder()
		WriteError(log, rec, httptest.NewRequest("GET", "/x", nil), tc.err)
		if rec.Code != tc.wantStatus || strings.TrimSpace(rec.Body.String()) != tc.wantBody {
			t.Errorf("got %d %s, want %d %s", rec.Code, rec.Body.String(), tc.wantStatus, tc.wantBody)
		}
	}
}

func TestDecodeJSON(t *testing.T) {
	type inner struct {
		N int `json:"n"`
	}
	type v struct {
		A string `json:"a"`
		I *inner `json:"i"`
	}
	cases := []struct {
		ct, body   string
		wantStatus int
		// wantMsg is the client's message: in JSON's terms, never Go's.
		wantMsg string
	}{
		{"application/json", `{"a":"x"}`, 0, ""},
		{"", `{"a":"x"}`, 0, ""},
		{"application/json; charset=utf-8", `{"a":"x"}`, 0, ""},
		{"text/plain", `{"a":"x"}`, http.StatusUnsupportedMediaType, ""},
		{"application/json", `{"a":"x","b":1}`, http.StatusBadRequest, `malformed JSON body: unknown field "b"`},
		{"application/json", `{"a":"x"} {}`, http.StatusBadRequest, "malformed JSON body: trailing data after the object"},
		{"application/json", `{"a":"x"}}`, http.StatusBadRequest, "malformed JSON body: trailing data after the object"},
		{"application/json", `{"a":"x"} ]`, http.StatusBadRequest, "malformed JSON body: trailing data after the object"},
		{"application/json", "{\"a\":\"x\"} \n", 0, ""},
		{"application/json", `{"a":`, http.StatusBadRequest, "malformed JSON body: unexpected end of the body"},
		{"application/json", ``, http.StatusBadRequest, "malformed JSON body: empty body"},
		{"application/json", `{"a":x}`, http.StatusBadRequest, "malformed JSON body: invalid JSON at byte 6"},
		{"application/json", `{"a":5}`, http.StatusBadRequest, `malformed JSON body: field "a" is a JSON number, want a string`},
		{"application/json", `{"i":{"n":"7"}}`, http.StatusBadRequest, `malformed JSON body: field "i.n" is a JSON string, want an integer`},
		{"application/json", `["a"]`, http.StatusBadRequest, `malformed JSON body: the body is a JSON array, want an object`},
	}
	for _, tc := range cases {
		r := httptest.NewRequest("POST", "/", nil)
		if tc.ct != "" {
			r.Header.Set("Content-Type", tc.ct)
		}
		var out v
		err := DecodeJSON(r, []byte(tc.body), &out)
		var he *Error
		switch {
		case tc.wantStatus == 0 && err != nil:
			t.Errorf("%q %q: got %v", tc.ct, tc.body, err)
		case tc.wantStatus != 0 && (!errors.As(err, &he) || he.Status != tc.wantStatus):
			t.Errorf("%q %q: got %v, want status %d", tc.ct, tc.body, err, tc.wantStatus)
		case tc.wantMsg != "" && he.Msg != tc.wantMsg:
			t.Errorf("%q %q: message %q, want %q", tc.ct, tc.body, he.Msg, tc.wantMsg)
		}
	}
}

func FuzzDecodeJSON(f *testing.F) {
	f.Add([]byte(`{"client_message_id":"m1","user_id":"u","text":"hi"}`))
	f.Add([]byte(`{"text":`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var v struct {
			ClientMessageID string `json:"client_message_id"`
			UserID          string `json:"user_id"`
			Text            string `json:"text"`
		}
		r := httptest.NewRequest("POST", "/", nil)
		err := DecodeJSON(r, body, &v)
		var he *Error
		if err != nil && (!errors.As(err, &he) || he.Status >= 500) {
			t.Fatalf("error for client input is not a 4xx *Error: %v", err)
		}
	})
}

func TestRoutesJSONFallbacks(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /things/{id}", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	h := Routes(mux, slog.New(slog.DiscardHandler))
	cases := []struct {
		method, path string
		status       int
		typ, allow   string
	}{
		{"POST", "/things/1", 204, "", ""},
		{"GET", "/things/1", 405, "method_not_allowed", "POST"},
		{"GET", "/nothing", 404, "not_found", ""},
	}
	for _, tc := range cases {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		if rec.Code != tc.status {
			t.Errorf("%s %s: got %d, want %d", tc.method, tc.path, rec.Code, tc.status)
		}
		if tc.typ != "" && (!strings.Contains(rec.Body.String(), `"type":"`+tc.typ+`"`) || rec.Header().Get("Content-Type") != "application/json") {
			t.Errorf("%s %s: body %q is not the JSON error of type %s", tc.method, tc.path, rec.Body.String(), tc.typ)
		}
		if got := rec.Header().Get("Allow"); tc.allow != "" && !strings.Contains(got, tc.allow) {
			t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
		}
	}
}

func TestBearerToken(t *testing.T) {
	for h, want := range map[string]string{
		"Bearer abc": "abc", "bearer abc": "abc", "BEARER  abc ": "abc",
		"Basic abc": "", "Bearer": "", "": "", "abc": "",
	} {
		r := httptest.NewRequest("GET", "/", nil)
		if h != "" {
			r.Header.Set("Authorization", h)
		}
		if got := BearerToken(r); got != want {
			t.Errorf("BearerToken(%q) = %q, want %q", h, got, want)
		}
	}
}
