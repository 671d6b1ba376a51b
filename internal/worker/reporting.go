package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/buildmcp"
	"github.com/talkide/talkide/internal/worker/harness"
	"github.com/talkide/talkide/internal/worker/issuemcp"
	"github.com/talkide/talkide/internal/worker/localproxy"
	"github.com/talkide/talkide/internal/worker/outbox"
	"github.com/talkide/talkide/internal/worker/reportclient"
	"github.com/talkide/talkide/internal/worker/reportfeed"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// reporting is the worker's side of reporting: the feed from the event
// logs to the control plane, the outbox on the session volume for issue
// writes, and the MCP servers offered to each CLI process
// (talkide-issue-tracking and the project's allowed .mcp.json servers).
type reporting struct {
	outbox *outbox.Outbox // nil without a control plane (development NoOp mode)
	client *reportclient.Client
	feed   *reportfeed.Feed
	feedM  *reportfeed.Metrics
	store  *sessionstore.Store
	// cursorDir holds the feed's cursors (the directory's name is from when
	// event reports went through the outbox).
	cursorDir string
	mcp       *mcpProvider
	log       *slog.Logger
}

// newReporting sets up reporting for c, minting with mc (the MintClient of
// the model calls). Without a control plane (mc nil: NoOpUpstream) nothing
// is reported and only project MCP servers are offered.
func newReporting(c Config, mc *localproxy.MintClient, store *sessionstore.Store, log *slog.Logger, reg prometheus.Registerer) (*reporting, error) {
	policy := c.MCPPolicy
	policy.Reserved = append(policy.Reserved, issuemcp.ServerName, buildmcp.ServerName)
	r := &reporting{store: store, log: log, mcp: &mcpProvider{policy: policy, log: log},
		cursorDir: filepath.Join(c.SessionDir, "talkide", "outbox-cursors")}
	if mc == nil {
		log.Warn("no control plane: reports are not sent and the talkide-issue-tracking MCP server is not offered")
		return r, nil
	}
	client := reportclient.New(c.GatewayBaseURL, mc, nil)
	dir := filepath.Join(c.SessionDir, "talkide", "outbox")
	ob, err := outbox.Open(outbox.Config{Dir: dir, Sender: client, Logger: log.With("component", "outbox"), Metrics: outbox.NewMetrics(reg)})
	if err != nil {
		return nil, err
	}
	r.outbox = ob
	r.client = client
	r.feedM = reportfeed.NewMetrics(reg)
	r.mcp.issues = issuemcp.New(issuemcp.Config{Queue: ob, Reader: client, Logger: log.With("component", "issue-mcp")})
	return r, nil
}

// notify is the harness's OnEvent hook.
func (r *reporting) notify(ev contract.Event) {
	if r.feed != nil {
		r.feed.Notify(ev)
	}
}

// start runs the outbox and the feed over h's event logs until the
// returned stop is called (after the harness has stopped, so its last
// events are still taken).
func (r *reporting) start(ctx context.Context, h *harness.Harness) (stop func()) {
	if r.outbox == nil {
		return func() {}
	}
	feed, err := reportfeed.New(reportfeed.Config{Sender: r.client, Logs: feedLogs{h}, List: r.store.List,
		Dir: r.cursorDir, Metrics: r.feedM, Logger: r.log.With("component", "report-feed")})
	if err != nil {
		r.log.Error("start report feed", "err", err)
		return func() {}
	}
	r.feed = feed
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.outbox.Run(ctx) })
	wg.Go(func() { feed.Run(ctx) })
	return func() { cancel(); wg.Wait() }
}

// feedLogs gives the feed the harness's event logs, a deleted
// conversation's as sessionstore.ErrNotFound.
type feedLogs struct{ h *harness.Harness }

func (l feedLogs) Events(conv string) (*sessionstore.EventLog, error) {
	el, err := l.h.Events(conv)
	if errors.Is(err, harness.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", sessionstore.ErrNotFound, conv)
	}
	return el, err
}
