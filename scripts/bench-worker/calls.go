package main

import (
	"net/http"
	"sort"
	"sync"
	"time"
)

// callLog times the model calls the development upstream answers, so a
// turn's time can be split into its parts (turns.go): before the first
// call, the calls, between them (the tool), and after the last.
type callLog struct {
	mu    sync.Mutex
	calls []modelCall
}

type modelCall struct{ start, end time.Time }

// wrap records the POST /v1/messages calls h answers.
func (l *callLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
			h.ServeHTTP(w, r)
			return
		}
		c := modelCall{start: time.Now()}
		h.ServeHTTP(w, r)
		c.end = time.Now()
		l.mu.Lock()
		l.calls = append(l.calls, c)
		l.mu.Unlock()
	})
}

// within returns the calls that started and ended within [from, to], in
// order of start.
func (l *callLog) within(from, to time.Time) []modelCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []modelCall
	for _, c := range l.calls {
		if !c.start.Before(from) && !c.end.After(to) {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out
}

// turnParts splits a turn from sent to done with its model calls: before
// the first call, in the calls, between them, after the last. For a turn of
// two calls with its tool call seen (hasTool), between is split further at
// the tool_use and the tool_result: toUse from the first call's end to the
// tool_use, tool from there to the tool_result, toCall from there to the
// second call's start.
type turnParts struct {
	before, calls, between, after time.Duration
	hasTool                       bool
	toUse, tool, toCall           time.Duration
}

// toolMarks are when a turn's tool_use and tool_result were seen (zero
// when not).
type toolMarks struct{ use, result time.Time }

func split(sent, done time.Time, calls []modelCall, m toolMarks) (turnParts, bool) {
	if len(calls) == 0 {
		return turnParts{}, false
	}
	p := turnParts{before: calls[0].start.Sub(sent), after: done.Sub(calls[len(calls)-1].end)}
	for i, c := range calls {
		p.calls += c.end.Sub(c.start)
		if i > 0 {
			p.between += c.start.Sub(calls[i-1].end)
		}
	}
	if len(calls) == 2 && !m.use.IsZero() && !m.result.IsZero() {
		p.hasTool = true
		p.toUse, p.tool, p.toCall = m.use.Sub(calls[0].end), m.result.Sub(m.use), calls[1].start.Sub(m.result)
	}
	return p, true
}
