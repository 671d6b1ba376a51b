package kubetest

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
)

// LogCut is how LogCutter cuts one pod log response: after At bytes of its
// body, moved on past any newline so that the cut falls inside a line.
// Dropped, the connection is aborted (the client reads an error); Clean,
// the response ends there as if whole, as the API server ends a log
// response whose kubelet connection dropped. At <= 0: the response is not
// cut.
type LogCut struct {
	At    int
	Clean bool
}

// LogCutter is an HTTP proxy in front of a cluster's API server that cuts
// pod log responses (…/pods/<name>/log) in the middle of a line, the n-th
// log request by the n-th LogCut; requests past the last are passed
// through whole, as is everything else. Safe for concurrent use.
type LogCutter struct {
	mu       sync.Mutex
	cuts     []LogCut       // guarded by mu
	requests []LogCutRecord // guarded by mu
}

// LogCutRecord is one log request the cutter saw: its query (follow,
// sinceTime, …) and whether it was cut, and where.
type LogCutRecord struct {
	Query string
	Cut   bool
	// At is the byte of the body the cut fell at (after LogCut.At moved
	// past newlines); Clean as LogCut.
	At    int
	Clean bool
}

func (r LogCutRecord) String() string {
	if !r.Cut {
		return r.Query + ": whole"
	}
	how := "dropped"
	if r.Clean {
		how = "ended"
	}
	return fmt.Sprintf("%s: %s at byte %d", r.Query, how, r.At)
}

// NewLogCutter starts a LogCutter for t (closed when t ends) in front of
// the API server of upstream, which authenticates the proxy's requests,
// and returns a client configuration that goes through it, with no
// credentials of its own (the proxy drops any it is sent).
func NewLogCutter(t testing.TB, upstream *rest.Config, cuts ...LogCut) (*rest.Config, *LogCutter) {
	t.Helper()
	target, err := url.Parse(upstream.Host)
	if err != nil {
		t.Fatalf("kubetest: log cutter upstream %q: %v", upstream.Host, err)
	}
	rt, err := rest.TransportFor(upstream)
	if err != nil {
		t.Fatalf("kubetest: log cutter transport: %v", err)
	}
	lc := &LogCutter{cuts: cuts}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Header.Del("Authorization")
		},
		Transport:     rt,
		FlushInterval: -1, // a log streams
		ModifyResponse: func(resp *http.Response) error {
			if resp.StatusCode != http.StatusOK || !strings.HasSuffix(resp.Request.URL.Path, "/log") {
				return nil
			}
			cut, rec := lc.next(resp.Request.URL.RawQuery)
			if cut.At > 0 {
				resp.Body = &cutBody{ReadCloser: resp.Body, left: cut.At, clean: cut.Clean, rec: rec, lc: lc}
			}
			return nil
		},
		// A dropped response is what the test asked for, not worth a line.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return &rest.Config{Host: srv.URL}, lc
}

// next takes the cut of the next log request and records it.
func (lc *LogCutter) next(query string) (LogCut, int) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	var c LogCut
	if len(lc.cuts) > 0 {
		c, lc.cuts = lc.cuts[0], lc.cuts[1:]
	}
	lc.requests = append(lc.requests, LogCutRecord{Query: query})
	return c, len(lc.requests) - 1
}

// Requests lists the log requests seen so far, in order.
func (lc *LogCutter) Requests() []LogCutRecord {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return append([]LogCutRecord(nil), lc.requests...)
}

// Cuts is how many responses were cut so far.
func (lc *LogCutter) Cuts() int {
	n := 0
	for _, r := range lc.Requests() {
		if r.Cut {
			n++
		}
	}
	return n
}

// errCut aborts a response the cutter drops.
var errCut = errors.New("kubetest: log response cut")

// cutBody passes left bytes of a body on, then further bytes one at a
// time until the last one passed is not a newline, then cuts.
type cutBody struct {
	io.ReadCloser
	left  int
	clean bool
	n     int  // bytes passed on
	last  byte // the last of them
	rec   int  // the request's record
	lc    *LogCutter
}

func (b *cutBody) Read(p []byte) (int, error) {
	if b.left <= 0 && b.n > 0 && b.last != '\n' {
		b.lc.mu.Lock()
		b.lc.requests[b.rec].Cut, b.lc.requests[b.rec].At, b.lc.requests[b.rec].Clean = true, b.n, b.clean
		b.lc.mu.Unlock()
		if b.clean {
			return 0, io.EOF
		}
		return 0, errCut
	}
	if len(p) == 0 {
		return 0, nil
	}
	if b.left > 0 {
		p = p[:min(len(p), b.left)]
	} else {
		p = p[:1]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= n
	b.n += n
	if n > 0 {
		b.last = p[n-1]
	}
	return n, err
}
