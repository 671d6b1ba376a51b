package worker

import (
	"context"
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
	"github.com/talkide/talkide/internal/worker/mcppolicy"
	"github.com/talkide/talkide/internal/worker/outbox"
	"github.com/talkide/talkide/internal/worker/reportclient"
	"github.com/talkide/talkide/internal/worker/reportfeed"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// ParseMCPPolicy reads the operator's MCP policy for project .mcp.json
// servers: TALKIDE_MCP_ALLOW_COMMANDS and TALKIDE_MCP_ALLOW_URLS,
// comma-separated globs (path.Match). Unset allows no project server.
func ParseMCPPolicy(getenv func(string) string) (mcppolicy.Policy, error) {
	cmds, err := mcppolicy.ParseList(getenv("TALKIDE_MCP_ALLOW_COMMANDS"))
	if err != nil {
		return mcppolicy.Policy{}, fmt.Errorf("TALKIDE_MCP_ALLOW_COMMANDS: %w", err)
	}
	urls, err := mcppolicy.ParseList(getenv("TALKIDE_MCP_ALLOW_URLS"))
	if err != nil {
		return mcppolicy.Policy{}, fmt.Errorf("TALKIDE_MCP_ALLOW_URLS: %w", err)
	}
	return mcppolicy.Policy{AllowCommands: cmds, AllowURLs: urls}, nil
}

// reporting is the worker's side of reporting: the outbox on the session
// volume, the feed from the event logs into it, and the MCP servers
// offered to each CLI process (talkide-issue-tracking and the project's
// allowed .mcp.json servers).
type reporting struct {
	outbox *outbox.Outbox // nil without a control plane (development NoOp mode)
	feed   *reportfeed.Feed
	store  *sessionstore.Store
	// cursorDir holds the feed's cursors, next to the outbox.
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
	feed, err := reportfeed.New(reportfeed.Config{Outbox: r.outbox, Logs: h, List: r.store.List,
		Dir: r.cursorDir, Logger: r.log.With("component", "report-feed")})
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

var _ reportfeed.Logs = (*harness.Harness)(nil)

// mcpProvider gives each CLI process the talkide-issue-tracking server (when
// reporting runs), the talkide-build server (when set) and the project's
// .mcp.json servers the policy allows.
type mcpProvider struct {
	issues *issuemcp.Server
	builds *buildmcp.Server
	policy mcppolicy.Policy
	log    *slog.Logger
}

var _ harness.MCPProvider = (*mcpProvider)(nil)

// MCPServers implements harness.MCPProvider.
func (p *mcpProvider) MCPServers(c harness.MCPConversation) (harness.MCPSetup, error) {
	var setup harness.MCPSetup
	switch {
	case c.ProjectConfigRefused:
		// Fixed words: the file may be a link to, or a hard link of, a file
		// the agent cannot read, and nothing of it may reach the agent.
		setup.Refused = append(setup.Refused, contract.MCPServerRefused{Reason: "the project's .mcp.json was not read: it must be a regular file of the agent's (not a symbolic link, FIFO or device, nor under one), at most 1 MiB"})
	case c.ProjectConfig != nil:
		setup.Config, setup.Refused = p.policy.Filter(c.ProjectConfig)
	}
	setup.Hosted = map[string]harness.MCPHandler{}
	var closers []func()
	setup.Close = func() {
		for _, c := range closers {
			c()
		}
	}
	if p.issues != nil {
		h, err := p.issues.Open(c.ConversationID)
		if err != nil {
			return harness.MCPSetup{}, err
		}
		setup.Hosted[issuemcp.ServerName] = h
		closers = append(closers, h.Close)
	}
	if p.builds != nil {
		h, err := p.builds.Open(buildmcp.Conversation{ID: c.ConversationID, UID: agentUID(c.AgentUser), Emit: c.Emit})
		if err != nil {
			setup.Close()
			return harness.MCPSetup{}, err
		}
		setup.Hosted[buildmcp.ServerName] = h
		closers = append(closers, h.Close)
	}
	return setup, nil
}
