package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/sse"
)

// The event source stands in for the workers: it serves the worker API's
// event stream (contract.PathEvents) as the worker does (the stored events
// after Last-Event-ID, then each new one as it is appended), framed by the
// same code, and appends events on the bench's request. Each event's text
// is "bench-ts=<unix nanoseconds>", the time it was appended, so a reader
// can tell how long it took to arrive. It does not check WorkerTokens: what
// is measured is the control plane's relay, not the worker (bench-worker
// measures that).

// source holds every conversation's events.
type source struct {
	mu    sync.Mutex
	convs map[string]*sourceConv
}

type sourceConv struct {
	frames  [][]byte // event i+1 framed
	changed chan struct{}
}

func (s *source) conv(id string) *sourceConv {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.convs[id]
	if c == nil {
		c = &sourceConv{changed: make(chan struct{})}
		s.convs[id] = c
	}
	return c
}

// emit appends one event to conversation id, stamped now.
func (s *source) emit(id string) {
	c := s.conv(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := int64(len(c.frames) + 1)
	now := time.Now()
	ev := contract.Event{ID: n, Type: contract.EventAssistantText, ConversationID: id, Time: now.UTC(),
		Data: []byte(`{"text":"bench-ts=` + strconv.FormatInt(now.UnixNano(), 10) + `"}`)}
	b, err := sse.JSONFrame(strconv.FormatInt(n, 10), string(ev.Type), ev)
	if err != nil {
		panic(err)
	}
	c.frames = append(c.frames, b)
	close(c.changed)
	c.changed = make(chan struct{})
}

// schedule is a run of emits the bench asks for: each of convs gets events
// events, interval apart, the conversations' first events spread over one
// interval.
type schedule struct {
	Convs    []string      `json:"convs"`
	Events   int           `json:"events"`
	Interval time.Duration `json:"interval"`
}

func (s *source) run(sc schedule) {
	var wg sync.WaitGroup
	start := time.Now()
	for i, id := range sc.Convs {
		offset := sc.Interval * time.Duration(i) / time.Duration(max(len(sc.Convs), 1))
		wg.Go(func() {
			for k := range sc.Events {
				time.Sleep(time.Until(start.Add(offset + time.Duration(k)*sc.Interval)))
				s.emit(id)
			}
		})
	}
	wg.Wait()
}

func (s *source) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/bench/run":
		var sc schedule
		if err := json.NewDecoder(r.Body).Decode(&sc); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.run(sc)
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/conversations/") && strings.HasSuffix(r.URL.Path, "/events"):
		id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/conversations/"), "/events")
		s.serveEvents(w, r, id)
	default:
		http.NotFound(w, r)
	}
}

func (s *source) serveEvents(w http.ResponseWriter, r *http.Request, id string) {
	after, err := sse.ParseID(r.Header.Get(contract.HeaderLastEventID))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c := s.conv(id)
	sw := sse.NewWriter(w)
	w.WriteHeader(http.StatusOK)
	if sw.WriteComment("bench source "+id) != nil {
		return
	}
	for {
		s.mu.Lock()
		next := c.frames[min(after, int64(len(c.frames))):]
		changed := c.changed
		s.mu.Unlock()
		for _, b := range next {
			if sw.WriteFrame(b) != nil {
				return
			}
			after++
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

// sourceMain serves the event source on 127.0.0.1 and prints its address
// on stdout.
func sourceMain() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench source:", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	srv := &http.Server{Handler: &source{convs: map[string]*sourceConv{}}}
	fmt.Fprintln(os.Stderr, "bench source:", srv.Serve(ln))
	os.Exit(1)
}
