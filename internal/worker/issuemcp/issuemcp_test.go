package issuemcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/mcphost"
	"github.com/talkide/talkide/internal/worker/outbox"
	"github.com/talkide/talkide/internal/worker/reportclient"
)

// fakeQueue answers writes like the control plane would, or never (down).
type fakeQueue struct {
	mu      sync.Mutex
	down    bool
	full    bool
	puts    []outbox.Entry
	results map[int64]outbox.Result
}

func (q *fakeQueue) Put(conv, method, path, key string, body []byte) (int64, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.full {
		return 0, outbox.ErrFull
	}
	q.puts = append(q.puts, outbox.Entry{Conversation: conv, Method: method, Path: path, Key: key, Body: body})
	seq := int64(len(q.puts))
	if !q.down {
		var is contract.Issue
		switch {
		case path == contract.PathReportIssues:
			var c contract.IssueCreate
			json.Unmarshal(body, &c)
			is = contract.Issue{Number: 7, Title: c.Title, State: "open"}
		case strings.Contains(path, "/99/"):
			q.results[seq] = outbox.Result{Err: &outbox.PermanentError{Status: 404, Msg: "issue not found"}}
			return seq, nil
		default:
			is = contract.Issue{Number: 7, Title: "t", State: "closed"}
		}
		b, _ := json.Marshal(contract.IssueAck{IdempotencyKey: key, Issue: is})
		q.results[seq] = outbox.Result{Delivered: true, Body: b}
	}
	return seq, nil
}

func (q *fakeQueue) Wait(ctx context.Context, conv string, seq int64) (outbox.Result, bool) {
	q.mu.Lock()
	r, ok := q.results[seq]
	q.mu.Unlock()
	if ok {
		return r, true
	}
	<-ctx.Done()
	return outbox.Result{Err: ctx.Err()}, false
}

type fakeReader struct{ err error }

func (r fakeReader) ListIssues(_ context.Context, conv, state string, limit int) (contract.IssueList, error) {
	if r.err != nil {
		return contract.IssueList{}, r.err
	}
	return contract.IssueList{Issues: []contract.Issue{{Number: 2, State: state, Title: "second"}, {Number: 1, State: state, Title: "first"}}}, nil
}

func (r fakeReader) GetIssue(_ context.Context, conv string, n int64) (contract.Issue, error) {
	if n != 1 {
		return contract.Issue{}, &reportclient.StatusError{Status: 404}
	}
	return contract.Issue{Number: 1, Title: "first", State: "open", Body: "details", Comments: []contract.IssueCommentEntry{{Seq: 1, Body: "a comment"}}}, nil
}

// cli drives a Handler as Claude Code does over mcp_message requests.
type cli struct {
	t  *testing.T
	h  *mcphost.Handler
	id int
}

func (c *cli) call(method string, params any) map[string]any {
	c.t.Helper()
	c.id++
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.id, "method": method, "params": params})
	resp, err := c.h.HandleMCP(c.t.Context(), b)
	if err != nil {
		c.t.Fatalf("%s: %v", method, err)
	}
	var out map[string]any
	if err := json.Unmarshal(resp, &out); err != nil {
		c.t.Fatalf("%s: %s: %v", method, resp, err)
	}
	if out["id"] != float64(c.id) {
		c.t.Fatalf("%s: response id %v, want %d", method, out["id"], c.id)
	}
	return out
}

func (c *cli) tool(name string, args any) (text string, isError bool) {
	c.t.Helper()
	out := c.call("tools/call", map[string]any{"name": name, "arguments": args, "_meta": map[string]any{"claudecode/toolUseId": "toolu_1", "progressToken": 2}})
	res, _ := out["result"].(map[string]any)
	if res == nil {
		c.t.Fatalf("tools/call %s: %v", name, out)
	}
	content, _ := res["content"].([]any)
	var parts []string
	for _, x := range content {
		parts = append(parts, fmt.Sprint(x.(map[string]any)["text"]))
	}
	isErr, _ := res["isError"].(bool)
	return strings.Join(parts, "\n"), isErr
}

func start(t *testing.T, q Queue, r Reader) *cli {
	t.Helper()
	h, err := New(Config{Queue: q, Reader: r, DeliveryWait: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}).Open("c1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	c := &cli{t: t, h: h}
	init := c.call("initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "claude-code", "version": "2.1.332"}})
	if init["result"] == nil {
		t.Fatalf("initialize: %v", init)
	}
	if resp, err := h.HandleMCP(t.Context(), json.RawMessage(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil || resp != nil {
		t.Fatalf("initialized notification: %s, %v", resp, err)
	}
	return c
}

func TestToolsAndSchemas(t *testing.T) {
	c := start(t, &fakeQueue{results: map[int64]outbox.Result{}}, fakeReader{})
	out := c.call("tools/list", map[string]any{})
	tools := out["result"].(map[string]any)["tools"].([]any)
	got := map[string]map[string]any{}
	for _, x := range tools {
		m := x.(map[string]any)
		got[m["name"].(string)] = m["inputSchema"].(map[string]any)
	}
	for name, required := range map[string][]string{
		"create_issue": {"title"}, "list_issues": nil, "get_issue": {"number"},
		"update_issue": {"number"}, "comment_issue": {"body", "number"},
	} {
		s, ok := got[name]
		if !ok {
			t.Errorf("tool %s missing; have %v", name, got)
			continue
		}
		var req []string
		rs, _ := s["required"].([]any)
		for _, r := range rs {
			req = append(req, r.(string))
		}
		slices.Sort(req)
		if fmt.Sprint(req) != fmt.Sprint(required) && !(len(req) == 0 && required == nil) {
			t.Errorf("%s requires %v, want %v", name, req, required)
		}
		if s["type"] != "object" {
			t.Errorf("%s schema type %v", name, s["type"])
		}
	}
	if len(got) != 5 {
		t.Errorf("%d tools, want 5", len(got))
	}
}

func TestCreateIssueDeliveredOrQueued(t *testing.T) {
	q := &fakeQueue{results: map[int64]outbox.Result{}}
	c := start(t, q, fakeReader{})
	txt, isErr := c.tool("create_issue", map[string]any{"title": "  the build is broken "})
	if isErr || txt != "Created issue #7: the build is broken" {
		t.Errorf("delivered: %q (error %v)", txt, isErr)
	}
	if len(q.puts) != 1 || q.puts[0].Path != contract.PathReportIssues || !strings.HasPrefix(q.puts[0].Key, "c1:mcp:") || q.puts[0].Conversation != "c1" {
		t.Errorf("queued %+v", q.puts)
	}
	q.down = true
	txt, isErr = c.tool("create_issue", map[string]any{"title": "flaky test"})
	if isErr || !strings.Contains(txt, "queued") || !strings.Contains(txt, "flaky test") {
		t.Errorf("control plane down: %q (error %v); want a queued note", txt, isErr)
	}
	q.full = true
	if txt, isErr = c.tool("create_issue", map[string]any{"title": "x"}); !isErr || !strings.Contains(txt, "Try again later") {
		t.Errorf("outbox full: %q (error %v)", txt, isErr)
	}
}

func TestToolInputErrors(t *testing.T) {
	q := &fakeQueue{results: map[int64]outbox.Result{}}
	c := start(t, q, fakeReader{err: errors.New("connection refused")})
	for _, tc := range []struct {
		tool string
		args any
		want string
	}{
		{"create_issue", map[string]any{}, "title"},
		{"create_issue", map[string]any{"title": 5}, "title"},
		{"create_issue", map[string]any{"title": strings.Repeat("x", 201)}, "title must be one line of 1-200 characters"},
		{"create_issue", map[string]any{"title": "a\nb"}, "one line"},
		{"update_issue", map[string]any{"number": 1}, "nothing to update"},
		{"update_issue", map[string]any{"number": 1, "state": "reopened"}, "state must be"},
		{"update_issue", map[string]any{"number": 0, "state": "open"}, "number must be"},
		{"update_issue", map[string]any{"number": 99, "state": "open"}, "No such issue"},
		{"comment_issue", map[string]any{"number": 1, "body": "  "}, "body must not be empty"},
		{"list_issues", map[string]any{"state": "weird"}, "state must be open, closed or all"},
		{"list_issues", map[string]any{}, "unreachable"},
		{"get_issue", map[string]any{"number": -1}, "number must be"},
	} {
		txt, isErr := c.tool(tc.tool, tc.args)
		if !isErr || !strings.Contains(txt, tc.want) {
			t.Errorf("%s %v: %q (error %v), want an error mentioning %q", tc.tool, tc.args, txt, isErr, tc.want)
		}
	}
	for _, e := range q.puts {
		if strings.Contains(e.Path, "/99/") {
			continue
		}
		t.Errorf("an invalid call was queued: %+v", e)
	}
}

func TestReadTools(t *testing.T) {
	c := start(t, &fakeQueue{results: map[int64]outbox.Result{}}, fakeReader{})
	if txt, isErr := c.tool("list_issues", map[string]any{}); isErr || txt != "#2 [open] second\n#1 [open] first" {
		t.Errorf("list: %q", txt)
	}
	if txt, isErr := c.tool("get_issue", map[string]any{"number": 1}); isErr || !strings.Contains(txt, "details") || !strings.Contains(txt, "a comment") {
		t.Errorf("get: %q", txt)
	}
	if txt, isErr := c.tool("get_issue", map[string]any{"number": 3}); !isErr || !strings.Contains(txt, "No such issue") {
		t.Errorf("get missing: %q", txt)
	}
	if txt, isErr := c.tool("comment_issue", map[string]any{"number": 1, "body": "hi"}); isErr || !strings.Contains(txt, "Commented on issue #7") {
		t.Errorf("comment: %q", txt)
	}
	if txt, isErr := c.tool("update_issue", map[string]any{"number": 1, "state": "closed"}); isErr || txt != "Updated issue #7 (closed): t" {
		t.Errorf("update: %q", txt)
	}
}
