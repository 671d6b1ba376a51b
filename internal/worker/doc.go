// Package worker is the per-tenant worker: its HTTP API for the control plane
// (every call must carry a request token signed for this worker's tenant-env,
// bound to the method, path and body, used once) and the assembly of its
// parts: the SessionStore, the LocalGatewayProxyServer and the harness that
// runs the Claude Code CLI.
//
// Main types: Config (what cmd/talkide-worker reads from the environment),
// Server (the HTTP handler) and Run. Request and event shapes are in package
// contract. It does not call the Anthropic API itself.
package worker
