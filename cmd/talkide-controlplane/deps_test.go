package main

import (
	"testing"

	"github.com/talkide/talkide/internal/deptest"
)

// TestDeps keeps the seam: the control plane holds the API key and the
// master key and runs no agent, so it links nothing that starts, confines
// or serves the Claude Code CLI, nor the worker's session state.
func TestDeps(t *testing.T) {
	const in = "github.com/talkide/talkide/internal/"
	deptest.Check(t, ".", map[string]string{
		in + "harness":      "the AnthropicAgentSdkHarness runs CLI processes; only the worker does",
		in + "claudecli":    "the pinned Claude Code CLI runs only in the worker",
		in + "streamjson":   "the CLI's stream-json protocol is spoken only by the worker",
		in + "sessionstore": "the SessionStore (transcripts, event logs) lives on the worker's volume",
		in + "worker/...":   "the worker, its LocalGatewayProxyServer and its report outbox, feed and sender",
		in + "sandbox":      "the agent's jail and user ids; the control plane runs no agent",
		in + "lease":        "ownership of a conversation's CLI session, taken by worker replicas",
		in + "buildjob":     "a conversation's build Jobs are dispatched by its worker",
		in + "buildmcp":     "the agent's build tool (an MCP server in the worker)",
		in + "issuemcp":     "the talkide-issue-tracking MCP server runs in the worker",
		in + "mcphost":      "MCP servers are hosted for the CLI by the worker",
		in + "mcppolicy":    "the filter of a project's .mcp.json applies where the CLI starts",
		in + "devupstream":  "a stand-in for Anthropic, its own binary",
		in + "localrun":     "the one-machine launcher",
		"github.com/modelcontextprotocol/go-sdk/...": "MCP servers run in the worker",
	})
}
