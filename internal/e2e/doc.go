// Package e2e holds end-to-end tests of the whole platform: the browser API
// of the control plane, the worker, the real pinned Claude Code CLI, the
// LocalGatewayProxyServer, the mint, the gateway-proxy and the development
// upstream, all over real HTTP on loopback (see package platformtest).
package e2e
