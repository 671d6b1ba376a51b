package worker

import (
	"strings"
	"testing"

	"github.com/talkide/talkide/internal/worker/harness"
	"github.com/talkide/talkide/internal/worker/mcppolicy"
)

// TestMCPProviderQuotesNothingOfTheFile: a .mcp.json the harness refused
// (a link to a root-only file, case C3) or one that does not parse gives one
// refusal in fixed words; the provider reads no file itself.
func TestMCPProviderQuotesNothingOfTheFile(t *testing.T) {
	p := &mcpProvider{policy: mcppolicy.Policy{AllowCommands: []string{"*"}}}
	for name, c := range map[string]harness.MCPConversation{
		"refused":  {ConversationID: "c1", WorkDir: t.TempDir(), ProjectConfigRefused: true},
		"not json": {ConversationID: "c1", WorkDir: t.TempDir(), ProjectConfig: []byte("lk1:SECRET")},
	} {
		setup, err := p.MCPServers(c)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(setup.Refused) != 1 || setup.Config != nil {
			t.Fatalf("%s: got %+v, want one refusal and no servers", name, setup)
		}
		if r := setup.Refused[0].Reason; strings.Contains(r, "SECRET") || strings.Contains(r, "invalid character") || strings.Contains(r, "'l'") {
			t.Errorf("%s: refusal quotes the file: %s", name, r)
		}
	}
	setup, err := p.MCPServers(harness.MCPConversation{ConversationID: "c1", WorkDir: t.TempDir()})
	if err != nil || len(setup.Refused) != 0 || setup.Config != nil {
		t.Errorf("no .mcp.json: got %+v, %v; want nothing", setup, err)
	}
}
