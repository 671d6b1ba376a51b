package main

import (
	"testing"

	"github.com/talkide/talkide/internal/deptest"
)

// TestDeps keeps the seam: the worker runs agents that execute whatever a
// conversation asks for, so it links nothing that holds the API key or the
// master key, reads the control plane's database, or spends money.
func TestDeps(t *testing.T) {
	const in = "github.com/talkide/talkide/internal/"
	deptest.Check(t, ".", map[string]string{
		in + "controlplane/...":       "the control plane's side (internal/controlplane/...): the gateway-proxy that holds ANTHROPIC_API_KEY, the budgets that spend users' money, the control plane's database, the mint that signs WorkerTokens with the master key, reporting's store, the provisioner, the signed client of workers",
		in + "devupstream":            "a stand-in for Anthropic; the worker reaches a model only through the gateway",
		in + "localrun":               "the one-machine launcher, which holds the master key",
		"github.com/jackc/pgx/v5/...": "the control plane's database driver",
		"modernc.org/sqlite/...":      "the control plane's database driver",
	})
}
