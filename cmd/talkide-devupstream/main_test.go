package main

import (
	"strings"
	"testing"
)

// TestKeyRequired guards against case C7's open development upstream: it
// started without a key and answered any local process, so an agent could
// spend model calls past the gateway and the budget.
func TestKeyRequired(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if _, err := parseOptions(nil, env(nil)); err == nil || !strings.Contains(err.Error(), "TALKIDE_DEVUPSTREAM_API_KEY") {
		t.Errorf("no key: got %v, want an error naming TALKIDE_DEVUPSTREAM_API_KEY", err)
	}
	o, err := parseOptions(nil, env(map[string]string{"TALKIDE_DEVUPSTREAM_API_KEY": "sk-dev-x"}))
	if err != nil || o.apiKey != "sk-dev-x" {
		t.Errorf("with a key: %+v, %v", o, err)
	}
	if o, err := parseOptions([]string{"-no-auth"}, env(nil)); err != nil || !o.noAuth {
		t.Errorf("-no-auth: %+v, %v", o, err)
	}
	if _, err := parseOptions([]string{"-no-auth"}, env(map[string]string{"TALKIDE_DEVUPSTREAM_API_KEY": "k"})); err == nil {
		t.Error("-no-auth with a key: want an error")
	}
}
