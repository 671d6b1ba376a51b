// Package mcppolicy decides which MCP servers of a project's .mcp.json the
// agent gets (design open point 4). The file is the project's, so it is
// outside input: it is parsed strictly and every server is checked against
// the operator's policy, TALKIDE_MCP_ALLOW_COMMANDS (globs of commands a
// stdio server may run) and TALKIDE_MCP_ALLOW_URLS (globs of URLs an http or
// sse server may use). The empty policy allows nothing. Servers that pass
// go to the CLI as a --mcp-config document; the others are returned as
// refusals, which the harness reports as mcp_server_refused events.
//
// Main types: Policy and its Filter. It does not start servers (the CLI
// does) and does not read files.
package mcppolicy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/talkide/talkide/internal/contract"
)

// MaxFileBytes bounds the .mcp.json read (1 MiB).
const MaxFileBytes = 1 << 20

// Policy is the operator's MCP policy.
type Policy struct {
	// AllowCommands are path.Match globs a stdio server's command must
	// match, as written in .mcp.json (e.g. "npx", "/usr/bin/*",
	// "mcp-server-*").
	AllowCommands []string
	// AllowURLs are path.Match globs an http or sse server's URL must
	// match (e.g. "https://mcp.example.com/*"); '*' does not cross '/'.
	AllowURLs []string
	// Reserved are server names the worker hosts itself
	// (talkide-issue-tracking); a project cannot replace them.
	Reserved []string
}

// ParseList splits a comma-separated environment value into globs and
// checks that each is a valid pattern.
func ParseList(s string) ([]string, error) {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("MCP policy pattern %q: %w", p, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// server is one entry of .mcp.json, as Claude Code reads it.
type server struct {
	Type    string            `json:"type,omitempty"`
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

var nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// Filter reads a .mcp.json document and returns the --mcp-config document of
// the servers the policy allows (nil when none) and a refusal for each other
// server. A document that cannot be parsed yields one refusal naming no
// server. Refusals never quote the parser's error (see below).
func (p Policy) Filter(doc []byte) (config json.RawMessage, refused []contract.MCPServerRefused) {
	refuse := func(name, transport, format string, args ...any) {
		refused = append(refused, contract.MCPServerRefused{Server: name, Transport: transport, Reason: fmt.Sprintf(format, args...)})
	}
	if len(doc) > MaxFileBytes {
		refuse("", "", ".mcp.json is over %d bytes", MaxFileBytes)
		return nil, refused
	}
	var file struct {
		MCPServers map[string]json.RawMessage `json:"mcpServers"`
	}
	// Parser errors are not shown: they quote the document ("invalid
	// character 'l'"), and what reaches the event must never echo a file
	// (if the harness were ever tricked into reading one that is not the
	// agent's, this is what would leak it).
	if err := json.Unmarshal(doc, &file); err != nil {
		refuse("", "", ".mcp.json is not valid JSON with an mcpServers object")
		return nil, refused
	}
	allowed := map[string]server{}
	names := make([]string, 0, len(file.MCPServers))
	for n := range file.MCPServers {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		shown := name
		if !nameRe.MatchString(name) {
			shown = strings.ToValidUTF8(name, "?")
			if len(shown) > 64 {
				shown = shown[:64]
			}
			refuse(shown, "", "server name must be 1-64 characters of [A-Za-z0-9_-]")
			continue
		}
		var s server
		dec := json.NewDecoder(bytes.NewReader(file.MCPServers[name]))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			refuse(name, "", "entry is not a server this policy understands (type, command, args, env, url, headers)")
			continue
		}
		transport := s.Type
		if transport == "" && s.Command != "" {
			transport = "stdio"
		}
		if slices.Contains(p.Reserved, name) {
			refuse(name, transport, "the name %s is reserved for the worker's own server", name)
			continue
		}
		switch transport {
		case "stdio":
			switch {
			case s.Command == "" || s.URL != "":
				refuse(name, transport, "a stdio server needs a command and no url")
			case !matchAny(p.AllowCommands, s.Command):
				refuse(name, transport, "command %s is not allowed by TALKIDE_MCP_ALLOW_COMMANDS", s.Command)
			default:
				allowed[name] = s
			}
		case "http", "sse":
			switch {
			case s.URL == "" || s.Command != "" || len(s.Args) > 0 || len(s.Env) > 0:
				refuse(name, transport, "an %s server needs a url and no command", transport)
			case !strings.HasPrefix(s.URL, "https://") && !strings.HasPrefix(s.URL, "http://"):
				refuse(name, transport, "url %s is not http(s)", s.URL)
			case !matchAny(p.AllowURLs, s.URL):
				refuse(name, transport, "url %s is not allowed by TALKIDE_MCP_ALLOW_URLS", s.URL)
			default:
				allowed[name] = s
			}
		default:
			refuse(name, transport, "transport %q is not supported (stdio, http or sse)", transport)
		}
	}
	if len(allowed) == 0 {
		return nil, refused
	}
	b, err := json.Marshal(map[string]any{"mcpServers": allowed})
	if err != nil {
		refuse("", "", "encode the allowed servers: %v", err)
		return nil, refused
	}
	return b, refused
}

func matchAny(globs []string, s string) bool {
	for _, g := range globs {
		if ok, _ := path.Match(g, s); ok {
			return true
		}
	}
	return false
}
