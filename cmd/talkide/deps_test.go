package main

import (
	"testing"

	"github.com/talkide/talkide/internal/deptest"
)

// TestDeps keeps the launcher a launcher: it runs the control plane, the
// worker and the development upstream as processes of their own, as
// production runs them as pods, so it links none of them. It may link what
// it needs to set a machine up (the database, the mint to issue the
// worker's identity token).
func TestDeps(t *testing.T) {
	const in = "github.com/talkide/talkide/internal/"
	deptest.Check(t, ".", map[string]string{
		in + "controlplane": "the control plane runs as its own process (talkide-controlplane)",
		in + "gateway":      "the gateway-proxy runs in the control plane's process",
		in + "budget":       "the budget is the control plane's, in its process",
		in + "reporting":    "worker reporting runs in the control plane's process",
		in + "provision":    "the provisioner runs in the control plane's process",
		in + "workerclient": "only the control plane calls workers",
		in + "worker/...":   "the worker runs as its own process (talkide-worker)",
		in + "harness":      "agents run in the worker's process",
		in + "sessionstore": "the SessionStore is the worker's, on its volume",
		in + "sandbox":      "agents are confined by the worker",
		in + "claudecli":    "the CLI is started by the worker",
		in + "buildjob":     "builds are dispatched by the worker",
		in + "devupstream":  "the development upstream runs as its own process (talkide-devupstream)",
	})
}
