// Package localproxy is the worker's LocalGatewayProxyServer: an HTTP
// server on 127.0.0.1:<dynamic port> that the Claude Code CLI processes use as
// ANTHROPIC_BASE_URL (http://127.0.0.1:<port>/<conversationId>).
//
// For every request it checks the per-conversation placeholder credential the
// CLI was started with (so a tool process of one conversation cannot spend as
// another), drops every incoming credential header, lets a GatewayProxy set the
// target and the outgoing credential, and streams the answer back unbuffered.
//
// Two GatewayProxy implementations exist: MintingGatewayProxy (production:
// mints a fresh WorkerToken for the conversation with the worker's identity
// token, then forwards to the control-plane gateway-proxy) and NoOpGatewayProxy
// (development only: forwards straight to an Anthropic-compatible upstream
// with a local API key, no control plane). MintClient calls the mint endpoint
// with the worker's Identity: its identity token, fixed or read from a file
// the control plane rotates, and the IdentityFailure the worker reports when
// the token is revoked or expired with no successor.
//
// It does not budget, meter or store anything; the control plane does.
package localproxy
