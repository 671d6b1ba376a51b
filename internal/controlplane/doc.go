// Package controlplane assembles the control plane (the "BE" side of the
// seam): the browser conversation API and its SSE stream, the mint endpoint,
// the gateway-proxy, and the client that drives workers with signed requests
// and relays their event streams. It serves the browser UI at / from package
// webui.
//
// Main types: Config (what cmd/talkide-controlplane reads from the
// environment), Server (the HTTP handler) and Run. It holds no per-session
// state: events live in the workers' SessionStores, so any number of
// control-plane replicas can serve the same browser streams.
package controlplane
