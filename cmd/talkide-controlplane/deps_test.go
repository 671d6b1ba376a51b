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
		in + "worker/...":  "the worker's side (internal/worker/...): its harness, the CLI's protocol and binary, the SessionStore, the jail, leases, build Jobs, MCP servers, the LocalGatewayProxyServer and the report outbox, feed and sender",
		in + "devupstream": "a stand-in for Anthropic, its own binary",
		in + "localrun":    "the one-machine launcher",
		"github.com/modelcontextprotocol/go-sdk/...": "MCP servers run in the worker",
	})
}
