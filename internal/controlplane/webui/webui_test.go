package webui

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
)

const testIndex = `<!doctype html><html lang="en"><head><link rel="stylesheet" href="assets/app-CSS1.css">` +
	`<script type="module" src="assets/app-JS1.js"></script></head><body><div id="app"></div></body></html>`

func builtFS() fstest.MapFS {
	return fstest.MapFS{
		"NOT-BUILT.txt":          {Data: []byte("placeholder")},
		"index.html":             {Data: []byte(testIndex)},
		"assets/app-JS1.js":      {Data: []byte("console.log(1)")},
		"assets/app-CSS1.css":    {Data: []byte("body{}")},
		"assets/logo-AB12.svg":   {Data: []byte("<svg/>")},
		"assets/font-CD34.woff2": {Data: []byte("wOF2")},
		"assets/sub/x-EF56.png":  {Data: []byte("\x89PNG")},
	}
}

// serve mounts h as the control plane does (GET / and GET /assets/ on a
// mux behind httpapi.Routes) and answers one request.
func serve(t *testing.T, h http.Handler, method, target string, hdr ...string) *http.Response {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", h)
	mux.Handle("GET /assets/", h)
	srv := httptest.NewServer(httpapi.Routes(mux, slog.New(slog.DiscardHandler)))
	t.Cleanup(srv.Close)
	req, err := http.NewRequest(method, srv.URL+target, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	// Requests are sent as written (no client-side cleaning) and redirects
	// are not followed: what the server does with the raw path is the test.
	req.URL.Opaque = target
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func checkSecurityHeaders(t *testing.T, what string, resp *http.Response) {
	t.Helper()
	want := map[string]string{
		"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
		"X-Frame-Options":         "DENY",
	}
	for k, v := range want {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("%s: %s: got %q, want %q", what, k, got, v)
		}
	}
}

func TestIndexIsServedUncachedWithStrictHeaders(t *testing.T) {
	h := newHandler(builtFS(), slog.New(slog.DiscardHandler))
	for _, target := range []string{"/", "/?c=conv_123", "/?c=conv_123&x=%3Cscript%3E"} {
		resp := serve(t, h, "GET", target)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: got status %d, want 200", target, resp.StatusCode)
		}
		if got := body(t, resp); got != testIndex {
			t.Errorf("GET %s: got body %q, want index.html", target, got)
		}
		if got := resp.Header.Get("Cache-Control"); got != "no-cache" {
			t.Errorf("GET %s: Cache-Control %q, want no-cache", target, got)
		}
		if got := resp.Header.Get("Content-Type"); got != "text/html; charset=utf-8" {
			t.Errorf("GET %s: Content-Type %q", target, got)
		}
		checkSecurityHeaders(t, "GET "+target, resp)
	}
	// Revalidation: the same build answers 304.
	tag := serve(t, h, "GET", "/").Header.Get("ETag")
	if tag == "" {
		t.Fatal("index has no ETag")
	}
	if resp := serve(t, h, "GET", "/", "If-None-Match", tag); resp.StatusCode != http.StatusNotModified {
		t.Errorf("GET / with If-None-Match: got %d, want 304", resp.StatusCode)
	}
	if resp := serve(t, h, "HEAD", "/"); resp.StatusCode != 200 || resp.ContentLength != int64(len(testIndex)) {
		t.Errorf("HEAD /: got %d, length %d", resp.StatusCode, resp.ContentLength)
	}
}

func TestHashedAssetsAreCachedForever(t *testing.T) {
	h := newHandler(builtFS(), slog.New(slog.DiscardHandler))
	for _, tc := range []struct{ path, ctype, body string }{
		{"/assets/app-JS1.js", "text/javascript; charset=utf-8", "console.log(1)"},
		{"/assets/app-CSS1.css", "text/css; charset=utf-8", "body{}"},
		{"/assets/logo-AB12.svg", "image/svg+xml", "<svg/>"},
		{"/assets/font-CD34.woff2", "font/woff2", "wOF2"},
		{"/assets/sub/x-EF56.png", "image/png", "\x89PNG"},
	} {
		resp := serve(t, h, "GET", tc.path)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: got status %d, want 200", tc.path, resp.StatusCode)
		}
		if got := body(t, resp); got != tc.body {
			t.Errorf("GET %s: got body %q, want %q", tc.path, got, tc.body)
		}
		if got := resp.Header.Get("Content-Type"); got != tc.ctype {
			t.Errorf("GET %s: Content-Type %q, want %q", tc.path, got, tc.ctype)
		}
		if got := resp.Header.Get("Cache-Control"); got != "public, max-age=31536000, immutable" {
			t.Errorf("GET %s: Cache-Control %q, want immutable for a year", tc.path, got)
		}
		checkSecurityHeaders(t, "GET "+tc.path, resp)
	}
}

// TestUnknownPathsAreRefused: no listing of a directory, no file outside
// assets/, nothing reached by a path with .. in it, however encoded.
func TestUnknownPathsAreRefused(t *testing.T) {
	h := newHandler(builtFS(), slog.New(slog.DiscardHandler))
	for _, target := range []string{
		"/assets/",
		"/assets/sub/",
		"/assets/sub",
		"/assets/app-OLD.js",
		"/assets/index.html",
		"/assets/../index.html",
		"/assets/..%2findex.html",
		"/assets/%2e%2e/NOT-BUILT.txt",
		"/assets/%2e%2e%2fNOT-BUILT.txt",
		"/assets//etc/passwd",
		"/assets/..%5cNOT-BUILT.txt",
		"/NOT-BUILT.txt",
		"/index.html",
	} {
		resp := serve(t, h, "GET", target)
		b := body(t, resp)
		switch {
		case resp.StatusCode == http.StatusNotFound:
			var eb contract.ErrorBody
			if err := json.Unmarshal([]byte(b), &eb); err != nil || eb.Error.Type != contract.ErrTypeNotFound {
				t.Errorf("GET %s: 404 body %q, want the JSON error shape", target, b)
			}
		case resp.StatusCode >= 300 && resp.StatusCode < 400:
			// The mux cleans a path with .. by redirecting to the clean
			// one, which is then looked up like any other.
			if loc := resp.Header.Get("Location"); strings.Contains(loc, "..") {
				t.Errorf("GET %s: redirect to %q", target, loc)
			}
		default:
			t.Errorf("GET %s: got status %d (%q), want 404", target, resp.StatusCode, b)
		}
		if strings.Contains(b, "placeholder") || strings.Contains(b, "<div id=\"app\">") || strings.Contains(b, "root:") {
			t.Errorf("GET %s: answered a file: %q", target, b)
		}
	}
	// The handler itself, given a raw path that no mux cleaned.
	for _, p := range []string{"/assets/../NOT-BUILT.txt", "/assets/../index.html", "/assets/./app-JS1.js", "/assets"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.URL.Path = p
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusNotFound {
			t.Errorf("handler, path %q: got %d, want 404", p, rec.Code)
		}
	}
}

func TestMissingBuildAnswers503AndLogsOnce(t *testing.T) {
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	h := newHandler(fstest.MapFS{"NOT-BUILT.txt": {Data: []byte("placeholder")}}, log)
	for range 3 {
		resp := serve(t, h, "GET", "/?c=abc")
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("got status %d, want 503", resp.StatusCode)
		}
		if b := body(t, resp); !strings.Contains(b, "make web") || !strings.Contains(b, "not built") {
			t.Errorf("page does not say the UI was not built and to run make web: %q", b)
		}
		if got := resp.Header.Get("Content-Type"); got != "text/html; charset=utf-8" {
			t.Errorf("Content-Type %q", got)
		}
		checkSecurityHeaders(t, "unbuilt /", resp)
	}
	if n := strings.Count(logs.String(), "browser UI not built"); n != 1 {
		t.Errorf("logged %d times that the UI is not built, want once:\n%s", n, logs.String())
	}
	if resp := serve(t, h, "GET", "/assets/app-JS1.js"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("asset of an unbuilt UI: got %d, want 404", resp.StatusCode)
	}
}

// TestEmbeddedBuildIsComplete checks what `make web` built, as embedded:
// the page has what the build promises and every file it names is served.
func TestEmbeddedBuildIsComplete(t *testing.T) {
	h := Handler(slog.New(slog.DiscardHandler))
	resp := serve(t, h, "GET", "/")
	if !Built() {
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("unbuilt UI: / answered %d, want 503", resp.StatusCode)
		}
		t.Skip("the browser UI is not built (run make web; make test does): nothing embedded to check")
	}
	if resp.StatusCode != 200 {
		t.Fatalf("GET /: got %d, want 200", resp.StatusCode)
	}
	page := body(t, resp)
	for _, want := range []string{`<html lang="en">`, `name="viewport"`, "<title>TalkIDE</title>", "<noscript>", `<div id="app">`, `type="module"`} {
		if !strings.Contains(page, want) {
			t.Errorf("index.html lacks %s:\n%s", want, page)
		}
	}
	if strings.Contains(page, "<script>") || strings.Contains(page, "<style") || strings.Contains(page, " style=") {
		t.Errorf("index.html holds inline code the CSP forbids:\n%s", page)
	}
	refs := regexp.MustCompile(`(?:src|href)="(assets/[^"]+)"`).FindAllStringSubmatch(page, -1)
	if len(refs) == 0 {
		t.Fatalf("index.html names no asset:\n%s", page)
	}
	for _, m := range refs {
		if !regexp.MustCompile(`-[A-Z0-9]{8}\.(js|css)$`).MatchString(m[1]) {
			t.Errorf("asset %s has no content hash in its name", m[1])
		}
		if resp := serve(t, h, "GET", "/"+m[1]); resp.StatusCode != 200 {
			t.Errorf("GET /%s: got %d, want 200", m[1], resp.StatusCode)
		}
	}
}
