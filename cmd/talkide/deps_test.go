package main

import (
	"testing"

	"github.com/talkide/talkide/internal/deptest"
)

// TestDeps keeps the launcher a launcher: it runs the worker and the
// development upstream as processes of their own, as production runs them
// as pods, so it links nothing that runs agents or stands in for Anthropic.
// It may link what it needs to set a machine up (the database, the mint to
// issue the worker's identity token, the users table for `talkide user
// add`); the control plane runs as a process of its own too.
func TestDeps(t *testing.T) {
	const in = "github.com/talkide/talkide/internal/"
	// Of the worker's side it may link only atomicfile (its state files);
	// of the control plane's, the database, the mint and pgdsn.
	deptest.Check(t, ".", map[string]string{
		in + "worker":                    "the worker runs as its own process (talkide-worker)",
		in + "worker/localproxy":         "the worker's LocalGatewayProxyServer",
		in + "worker/harness":            "agents run in the worker's process",
		in + "worker/sessionstore":       "the SessionStore is the worker's, on its volume",
		in + "worker/sandbox":            "agents are confined by the worker",
		in + "worker/claudecli":          "the CLI is started by the worker",
		in + "worker/buildjob":           "builds are dispatched by the worker",
		in + "devupstream":               "the development upstream runs as its own process (talkide-devupstream)",
		in + "controlplane":              "the control plane runs as its own process (talkide-controlplane)",
		in + "controlplane/gateway":      "the gateway-proxy holds the API key, in the control plane's process",
		in + "controlplane/budget":       "budgets are booked by the control plane",
		in + "controlplane/webui":        "the browser UI is served by the control plane",
		in + "controlplane/provision":    "workers are provisioned by the control plane",
		in + "controlplane/reporting":    "workers report to the control plane",
		in + "controlplane/workerclient": "the control plane calls workers",
	})
}
