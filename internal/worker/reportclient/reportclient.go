// Package reportclient is the worker's client of the control plane's
// reporting endpoints (/api/internal/worker/*). It authenticates each call
// with a WorkerToken of the report's conversation, minted with the worker's
// identity token and cached until shortly before it expires.
//
// Client implements reportfeed.Sender (event reports in batches, one
// WorkerToken per conversation) and outbox.Sender (queued issue writes),
// and reads a tenant-env's issues for the talkide-issue-tracking MCP
// server. It does not queue or retry (packages reportfeed and outbox do).
package reportclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/worker/localproxy"
	"github.com/talkide/talkide/internal/worker/outbox"
	"github.com/talkide/talkide/internal/worker/reportfeed"
)

// Minter mints WorkerTokens (localproxy.MintClient).
type Minter interface {
	Mint(ctx context.Context, conv string) (contract.MintResponse, error)
}

var _ Minter = (*localproxy.MintClient)(nil)

// Client calls the reporting endpoints.
type Client struct {
	base *url.URL
	mint Minter
	http *http.Client

	mu sync.Mutex
	// tokens caches a WorkerToken per conversation; guarded by mu.
	tokens map[string]contract.MintResponse
}

var (
	_ outbox.Sender     = (*Client)(nil)
	_ reportfeed.Sender = (*Client)(nil)
)

// New returns a client of the control plane at base (TALKIDE_GATEWAY_BASE_URL).
// hc nil means a client with a 30 s timeout.
func New(base *url.URL, mint Minter, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	return &Client{base: base, mint: mint, http: hc, tokens: map[string]contract.MintResponse{}}
}

// StatusError is an error answer of the control plane.
type StatusError struct {
	Status int
	Type   string
	Msg    string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("control plane: %d %s: %s", e.Status, e.Type, e.Msg)
}

// tokenRenewBefore is how long before its expiry a cached token is replaced.
const tokenRenewBefore = 30 * time.Second

func (c *Client) token(ctx context.Context, conv string) (string, error) {
	now := time.Now()
	c.mu.Lock()
	t, ok := c.tokens[conv]
	c.mu.Unlock()
	if ok && now.Add(tokenRenewBefore).Before(t.ExpiresAt) {
		return t.Token, nil
	}
	mr, err := c.mint.Mint(ctx, conv)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	for k, v := range c.tokens { // drop expired tokens: the map stays small
		if now.After(v.ExpiresAt) {
			delete(c.tokens, k)
		}
	}
	c.tokens[conv] = mr
	c.mu.Unlock()
	return mr.Token, nil
}

func (c *Client) forget(conv string) {
	c.mu.Lock()
	delete(c.tokens, conv)
	c.mu.Unlock()
}

// do sends one request for conversation conv and returns the answer body of
// a 200, a *StatusError for another status, or a transport error.
func (c *Client) do(ctx context.Context, conv, method, path string, body []byte) ([]byte, error) {
	tok, err := c.token(ctx, conv)
	if err != nil {
		return nil, err
	}
	b, err := c.call(ctx, tok, method, path, body)
	var se *StatusError
	if errors.As(err, &se) && se.Status == http.StatusUnauthorized {
		c.forget(conv) // expired or rotated: mint a fresh one next time
	}
	return b, err
}

// statusError is an answer's status with its error detail (nil: none).
func statusError(status int, d *contract.ErrorDetail) *StatusError {
	se := &StatusError{Status: status}
	if d != nil {
		se.Type, se.Msg = d.Type, d.Message
	}
	return se
}

// call sends one request with X-Worker-Token tok.
func (c *Client) call(ctx context.Context, tok, method, path string, body []byte) ([]byte, error) {
	u := httpapi.JoinURL(c.base, path)
	if i := bytes.IndexByte([]byte(path), '?'); i >= 0 { // JoinURL takes paths only
		u = httpapi.JoinURL(c.base, path[:i])
		u.RawQuery = path[i+1:]
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set(contract.HeaderWorkerToken, tok)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("read control plane answer: %w", err)
	}
	if resp.StatusCode == http.StatusOK {
		return b, nil
	}
	var eb contract.ErrorBody
	_ = json.Unmarshal(b, &eb)
	return nil, &StatusError{Status: resp.StatusCode, Type: eb.Error.Type, Msg: eb.Error.Message}
}

// SendReports implements reportfeed.Sender: the groups go in one
// contract.ReportBatch, each under a WorkerToken of its conversation. A
// group whose token cannot be minted is answered without being sent (a
// mint refusal of the conversation is permanent); a group whose token the
// control plane refuses has its token renewed next time. A report the
// control plane could not store now fails its group, to be sent again.
func (c *Client) SendReports(ctx context.Context, groups []reportfeed.Group) ([]reportfeed.GroupResult, error) {
	out := make([]reportfeed.GroupResult, len(groups))
	var batch contract.ReportBatch
	var sent []int // indexes into groups of batch.Groups
	for i, g := range groups {
		tok, err := c.token(ctx, g.Conversation)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			out[i] = reportfeed.GroupResult{Err: err, Permanent: Permanent(err)}
			continue
		}
		rg := contract.ReportGroup{WorkerToken: tok, Reports: make([]contract.BatchedReport, len(g.Reports))}
		for k, r := range g.Reports {
			rg.Reports[k] = contract.BatchedReport{Kind: r.Kind, Report: r.Body}
		}
		batch.Groups = append(batch.Groups, rg)
		sent = append(sent, i)
	}
	if len(sent) == 0 {
		return out, nil
	}
	body, err := json.Marshal(batch)
	if err != nil {
		return nil, fmt.Errorf("encode report batch: %w", err)
	}
	// The request is authenticated by its first group's token before the
	// control plane reads the body; each group then by its own.
	b, err := c.call(ctx, batch.Groups[0].WorkerToken, http.MethodPost, contract.PathReportBatch, body)
	if err != nil {
		var se *StatusError
		if errors.As(err, &se) && se.Status == http.StatusUnauthorized {
			c.forget(groups[sent[0]].Conversation)
		}
		return nil, err
	}
	var ack contract.ReportBatchAck
	if err := json.Unmarshal(b, &ack); err != nil || len(ack.Groups) != len(sent) {
		return nil, fmt.Errorf("control plane: unreadable answer to a batch of %d groups", len(sent))
	}
	for k, i := range sent {
		g, ga := groups[i], ack.Groups[k]
		if ga.Status != http.StatusOK {
			if ga.Status == http.StatusUnauthorized {
				c.forget(g.Conversation)
			}
			se := statusError(ga.Status, ga.Error)
			out[i] = reportfeed.GroupResult{Err: se, Permanent: Permanent(se)}
			continue
		}
		if len(ga.Results) != len(g.Reports) {
			out[i] = reportfeed.GroupResult{Err: fmt.Errorf("control plane: %d answers for %d reports", len(ga.Results), len(g.Reports))}
			continue
		}
		for n, rr := range ga.Results {
			if rr.Status == http.StatusOK {
				continue
			}
			se := statusError(rr.Status, rr.Error)
			if !Permanent(se) {
				out[i] = reportfeed.GroupResult{Err: fmt.Errorf("report %s: %w", g.Reports[n].Key, se)}
				break
			}
			out[i].Refused = append(out[i].Refused, g.Reports[n].Key+": "+se.Error())
		}
		if out[i].Err != nil {
			out[i].Refused = nil // the group is sent again whole
		}
	}
	return out, nil
}

// Permanent reports whether err is a refusal that retrying cannot fix: a
// 4xx answer other than 401 (a token to renew), 408 and 429, or a mint
// refusal of the conversation (403: not in this tenant-env).
func Permanent(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Status >= 400 && se.Status < 500 && se.Status != 401 && se.Status != 408 && se.Status != 429
	}
	var me *localproxy.MintError
	return errors.As(err, &me) && (me.Status == http.StatusForbidden || me.Status == http.StatusBadRequest)
}

// Send implements outbox.Sender.
func (c *Client) Send(ctx context.Context, e outbox.Entry) ([]byte, error) {
	b, err := c.do(ctx, e.Conversation, e.Method, e.Path, e.Body)
	if err != nil && Permanent(err) {
		return nil, &outbox.PermanentError{Status: statusOf(err), Msg: err.Error()}
	}
	return b, err
}

func statusOf(err error) int {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Status
	}
	var me *localproxy.MintError
	if errors.As(err, &me) {
		return me.Status
	}
	return 0
}

// ListIssues lists the issues of the tenant-env of conversation conv
// (state "open", "closed" or "all"; limit 0 for the default).
func (c *Client) ListIssues(ctx context.Context, conv, state string, limit int) (contract.IssueList, error) {
	q := url.Values{}
	if state != "" {
		q.Set("state", state)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := contract.PathReportIssues
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out contract.IssueList
	b, err := c.do(ctx, conv, http.MethodGet, path, nil)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	return out, err
}

// GetIssue reads one issue of the tenant-env of conversation conv.
func (c *Client) GetIssue(ctx context.Context, conv string, number int64) (contract.Issue, error) {
	var out contract.Issue
	b, err := c.do(ctx, conv, http.MethodGet, IssuePath(contract.PathReportIssue, number), nil)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	return out, err
}

// IssuePath fills {number} of an issue path constant.
func IssuePath(pattern string, number int64) string {
	return string(bytes.Replace([]byte(pattern), []byte("{number}"), []byte(strconv.FormatInt(number, 10)), 1))
}
