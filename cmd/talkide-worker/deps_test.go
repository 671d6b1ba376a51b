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
		in + "gateway":                "the gateway-proxy holds ANTHROPIC_API_KEY; the worker reaches Anthropic only through it",
		in + "budget":                 "the UserBudgetService spends users' money; only the control plane does",
		in + "controlstore":           "the control plane's database (users, budgets, identity-token records)",
		in + "mint":                   "the mint endpoint signs WorkerTokens with the control plane's master key",
		in + "reporting":              "the control plane's side of worker reporting, which writes its database",
		in + "provision":              "the provisioner holds the master key and makes workers' identity tokens",
		in + "controlplane":           "the control plane itself",
		in + "workerclient":           "the control plane's signed client of workers, with their request keys",
		in + "devupstream":            "a stand-in for Anthropic; the worker reaches a model only through the gateway",
		in + "localrun":               "the one-machine launcher, which holds the master key",
		"github.com/jackc/pgx/v5/...": "the control plane's database driver",
		"modernc.org/sqlite/...":      "the control plane's database driver",
	})
}
