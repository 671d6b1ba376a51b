package main

import (
	"testing"

	"github.com/talkide/talkide/internal/deptest"
)

// TestDeps keeps the development upstream a stand-in for Anthropic: it
// knows nothing of the platform (tokens, budgets, workers), so what works
// against it works against any Anthropic-compatible upstream.
func TestDeps(t *testing.T) {
	deptest.Only(t, ".", "github.com/talkide/talkide/",
		"the development upstream stands in for Anthropic and links no platform package",
		"github.com/talkide/talkide/internal/devupstream")
}
