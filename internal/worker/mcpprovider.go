package worker

import (
	"fmt"
	"log/slog"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/buildmcp"
	"github.com/talkide/talkide/internal/worker/harness"
	"github.com/talkide/talkide/internal/worker/issuemcp"
	"github.com/talkide/talkide/internal/worker/mcppolicy"
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
