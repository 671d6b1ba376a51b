package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/talkide/talkide/internal/sse"
)

// stream is one reader of an event stream: a browser stream of the
// control plane, or a direct read of the source. It reads on a goroutine
// of its own, recording each event's latency (arrival minus the source's
// stamp) and whether ids came in order, once each.
type stream struct {
	conn net.Conn
	rec  *recorder
	last int64
	got  atomic.Int64
}

// refusal is a stream the server did not open.
type refusal struct {
	Status     int
	RetryAfter string
	Body       string
}

func (r *refusal) Error() string {
	return fmt.Sprintf("%d (Retry-After %q): %s", r.Status, r.RetryAfter, r.Body)
}

// openStream opens GET path on addr with a bare connection (one socket,
// one goroutine: the bench holds tens of thousands). A non-200 answer is a
// *refusal.
func openStream(addr, path, bearer string, rec *recorder) (*stream, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	req.Header.Set("Accept", "text/event-stream")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, err
	}
	br := bufio.NewReaderSize(conn, 2048)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		conn.Close()
		return nil, &refusal{Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After"), Body: string(bytes.TrimSpace(b))}
	}
	conn.SetDeadline(time.Time{})
	s := &stream{conn: conn, rec: rec}
	go s.read(resp.Body)
	return s, nil
}

func (s *stream) read(body io.Reader) {
	r := sse.NewReader(body)
	for {
		e, err := r.Next()
		if err != nil {
			return
		}
		now := time.Now().UnixNano()
		id, _ := strconv.ParseInt(e.ID, 10, 64)
		switch {
		case id == s.last+1:
		case id <= s.last:
			s.rec.dups.Add(1)
			continue
		default:
			s.rec.gaps.Add(id - s.last - 1)
		}
		s.last = id
		if i := bytes.Index(e.Data, []byte("bench-ts=")); i >= 0 {
			j := i + len("bench-ts=")
			k := j
			for k < len(e.Data) && e.Data[k] >= '0' && e.Data[k] <= '9' {
				k++
			}
			if ts, err := strconv.ParseInt(string(e.Data[j:k]), 10, 64); err == nil {
				s.rec.add(now - ts)
			}
		}
		s.got.Add(1)
	}
}

func (s *stream) close() { s.conn.Close() }

// recorder gathers latencies (nanoseconds) and order faults of a group of
// streams.
type recorder struct {
	mu         sync.Mutex
	ns         []int64
	gaps, dups atomic.Int64
}

func (r *recorder) add(ns int64) {
	r.mu.Lock()
	r.ns = append(r.ns, ns)
	r.mu.Unlock()
}

// pct returns the p-th percentile in milliseconds (0 when none).
func (r *recorder) pct(p float64) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ns) == 0 {
		return 0
	}
	s := slices.Clone(r.ns)
	slices.Sort(s)
	return float64(s[min(int(p/100*float64(len(s))), len(s)-1)]) / 1e6
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ns)
}

// openMany opens n streams with conc at a time, path(i) for the i-th; it
// stops at the first refusal or error and returns what it opened with it.
func openMany(n, conc int, open func(i int) (*stream, error)) ([]*stream, error) {
	var (
		mu      sync.Mutex
		out     []*stream
		firstEr error
		next    atomic.Int64
		wg      sync.WaitGroup
	)
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				mu.Lock()
				stop := firstEr != nil
				mu.Unlock()
				if stop {
					return
				}
				s, err := open(i)
				mu.Lock()
				if err != nil {
					if firstEr == nil {
						firstEr = err
					}
				} else {
					out = append(out, s)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out, firstEr
}

// waitGot waits until every stream got want events or timeout passed; it
// returns how many events are missing.
func waitGot(ss []*stream, want int64, timeout time.Duration) int64 {
	deadline := time.Now().Add(timeout)
	for {
		var missing int64
		for _, s := range ss {
			missing += max(want-s.got.Load(), 0)
		}
		if missing == 0 || time.Now().After(deadline) {
			return missing
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func closeAll(ss []*stream) {
	for _, s := range ss {
		s.close()
	}
}
