package devupstream

import (
	"encoding/json"
	"sort"
	"strings"
)

// IssueToolName is the MCP tool that [DemoResponder] calls for
// "file an issue: …" prompts (server talkide-issue-tracking, tool
// create_issue).
const IssueToolName = "mcp__talkide-issue-tracking__create_issue"

// BuildToolName is the MCP tool that [DemoResponder] calls for "run the
// tests" prompts (server talkide-build, tool run_build).
const BuildToolName = "mcp__talkide-build__run_build"

// maxQuoted is how many characters of a tool result DemoResponder quotes.
const maxQuoted = 8000

// DemoResponder is the default [Responder]: a deterministic stand-in for a
// model, enough to drive the CLI through a tool round trip. It looks at the
// request in this order:
//
//  1. output_config.format.type "json_schema" (the CLI's session-title
//     call): text holding a JSON value for the schema, e.g.
//     {"title":"<first words of the prompt>"}.
//  2. The newest non-system message is a user message whose last block
//     (ignoring <system-reminder> texts) is a tool_result: text quoting
//     the result, "The command printed:\n\n<output>" (or "The command
//     failed:" when is_error).
//  3. The newest user text (last text block of the last user message that
//     does not start with <system-reminder>) starts with "file an issue:"
//     (any case) and the request offers tools: a tool_use of
//     [IssueToolName] with input {"title": <the rest, trimmed>}.
//     Likewise a text that starts with "run the tests" (any case): the
//     text "I'll run the tests." and a tool_use of [BuildToolName] with
//     input {"tasks": ["test"]}.
//  4. That text says "subagent" or "sub-agent" (any case), holds a
//     non-empty span between single backticks, the request offers the
//     CLI's sub-agent tool ([SubagentToolName], or "Task") and is not
//     itself a sub-agent's (see [IsSubagentRequest]): the text "I'll ask a
//     subagent to run that." and a tool_use of that tool with input
//     {"description": "Run <span>" (cut to 60 characters), "prompt":
//     "Run `<span>` with the Bash tool and report its output.",
//     "subagent_type": "general-purpose", "run_in_background": false}
//     (so the Agent call ends with the sub-agent, within the turn). The
//     sub-agent's own model calls then meet rules 5 and 2 (its prompt
//     holds the backticked command), and the main agent's next call rule
//     2, which quotes the sub-agent's report: "The subagent
//     reported:\n\n<report>".
//  5. That text holds a non-empty span between single backticks and the
//     request offers the Bash tool: the text "I'll run that." and a
//     tool_use of Bash with input {"command": <span>, "description":
//     "Run <span>"}, stop_reason "tool_use".
//  6. Otherwise: text echoing the prompt (first 200 characters) with a hint.
//
// The worker's continuation after a restart cut a permission wait ("(TalkIDE:
// the session was restarted while you waited for permission to use T. …")
// is answered, as a model would, with T's last call again, same input.
//
// File edits come before rule 2, so the agent can read before it edits, as
// Claude Code requires: a text "create file `P` containing `T`" is answered
// with a Write of T to P, and "in `P` replace `A` with `B`" with a Read of
// P, then (once the Read succeeded) an Edit of A to B; the results are then
// quoted by rule 2. A relative P is taken from the working directory the
// CLI's system prompt names ("Primary working directory: …").
type DemoResponder struct{}

// SubagentToolName is the tool Claude Code 2.1.332 offers the model to start
// a sub-agent (its system/init line lists the same tool as "Task"). Its
// input: description and prompt (required), subagent_type, model, effort,
// run_in_background (sub-agents run in the background unless it is false),
// isolation.
const SubagentToolName = "Agent"

// IsSubagentRequest reports whether a model call is a sub-agent's: Claude
// Code 2.1.332 marks them in the first system block, the billing header
// "x-anthropic-billing-header: …; cc_is_subagent=true;". Its first user
// message holds the prompt of the Agent call that started it.
func IsSubagentRequest(req *Request) bool {
	for _, s := range req.System {
		if strings.Contains(s, "cc_is_subagent=true") {
			return true
		}
	}
	return false
}

var _ Responder = DemoResponder{}

// ModelID is the model the development upstream answers as, whatever model
// the request names, unless a scripted Response (or a Responder's) names
// one. The built-in price table lists it at a price of its own (budget's
// default_prices.json): a demo turn costs a fraction of a cent, so budgets
// of any size show how they behave.
const ModelID = "talkide-dev-upstream"

// Respond implements [Responder].
func (DemoResponder) Respond(req *Request) Response {
	if req.OutputFormat == "json_schema" {
		return Response{Content: []ContentBlock{Text(schemaAnswer(req.OutputSchema, titleWords(lastUserText(req.Messages))))}}
	}
	if r, ok := fileEdit(req); ok {
		return r
	}
	if r, ok := continueAfterRestart(req); ok {
		return r
	}
	if last := lastNonSystem(req.Messages); last != nil && last.Role == "user" {
		if results := trailingToolResults(last.Content); len(results) > 0 {
			return Response{Content: []ContentBlock{Text(quoteResults(req.Messages, results))}}
		}
	}
	text := strings.TrimSpace(lastUserText(req.Messages))
	if rest, ok := cutPrefixFold(text, "file an issue:"); ok && len(req.Tools) > 0 {
		// MCP tools are deferred (not listed in tools[]) yet callable by
		// name, so only an empty tools list rules this out.
		return Response{Content: []ContentBlock{ToolUse(IssueToolName, map[string]string{"title": strings.TrimSpace(rest)})}}
	}
	if _, ok := cutPrefixFold(text, "run the tests"); ok && len(req.Tools) > 0 {
		return Response{Content: []ContentBlock{Text("I'll run the tests."), ToolUse(BuildToolName, map[string]any{"tasks": []string{"test"}})}}
	}
	if cmd := backtickCommand(text); cmd != "" && mentionsSubagent(text) && !IsSubagentRequest(req) {
		for _, tool := range []string{SubagentToolName, "Task"} {
			if req.HasTool(tool) {
				return Response{Content: []ContentBlock{
					Text("I'll ask a subagent to run that."),
					ToolUse(tool, map[string]any{
						"description": truncate("Run "+cmd, 60), "prompt": "Run `" + cmd + "` with the Bash tool and report its output.",
						"subagent_type": "general-purpose", "run_in_background": false,
					}),
				}}
			}
		}
	}
	if cmd := backtickCommand(text); cmd != "" && req.HasTool("Bash") {
		return Response{Content: []ContentBlock{
			Text("I'll run that."),
			ToolUse("Bash", map[string]string{"command": cmd, "description": "Run " + cmd}),
		}}
	}
	return Response{Content: []ContentBlock{Text(`You said: "` + truncate(text, 200) +
		`". I am the TalkIDE development upstream; put a command between backticks and I will run it.`)}}
}

// lastNonSystem returns the newest message whose role is not "system".
func lastNonSystem(msgs []Message) *Message {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role != "system" {
			return &msgs[i]
		}
	}
	return nil
}

// isReminder reports whether a block is a text block the CLI injects
// (<system-reminder>…) or an empty text, neither of which is the user's.
func isReminder(b Block) bool {
	if b.Type != "text" {
		return false
	}
	t := strings.TrimSpace(b.Text)
	return t == "" || strings.HasPrefix(t, "<system-reminder>")
}

// trailingToolResults returns the tool_result blocks of a user message
// when, ignoring reminder texts, the message ends with them; nil when the
// user wrote something after them.
func trailingToolResults(content []Block) []Block {
	var out []Block
scan:
	for i := len(content) - 1; i >= 0; i-- {
		switch b := content[i]; {
		case b.Type == "tool_result":
			out = append(out, b)
		case b.Type == "text" && !isReminder(b):
			break scan // the user's own words: after the results, or before them
		}
	}
	for l, r := 0, len(out)-1; l < r; l, r = l+1, r-1 {
		out[l], out[r] = out[r], out[l]
	}
	return out
}

// lastUserText returns the last non-reminder text block of the last user
// message, or "".
func lastUserText(msgs []Message) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role != "user" {
			continue
		}
		c := msgs[i].Content
		for j := len(c) - 1; j >= 0; j-- {
			if c[j].Type == "text" && !isReminder(c[j]) {
				return c[j].Text
			}
		}
		return ""
	}
	return ""
}

// quoteResults answers tool results: one quoted output per result, named
// after the tool that produced it.
func quoteResults(msgs []Message, results []Block) string {
	names := map[string]string{}
	for _, m := range msgs {
		for _, b := range m.Content {
			if b.Type == "tool_use" {
				names[b.ID] = b.Name
			}
		}
	}
	parts := make([]string, 0, len(results))
	for _, r := range results {
		subject := "The command"
		if n := names[r.ToolUseID]; n != "" && n != "Bash" {
			subject = "The tool " + n
		}
		out := truncate(strings.TrimSpace(withoutCLIHints(r.ResultText)), maxQuoted)
		if n := names[r.ToolUseID]; (n == SubagentToolName || n == "Task") && !r.IsError {
			parts = append(parts, "The subagent reported:\n\n"+truncate(subagentReport(r.ResultText), maxQuoted))
			continue
		}
		switch {
		case r.IsError:
			parts = append(parts, subject+" failed:\n\n"+out)
		case out == "":
			parts = append(parts, subject+" printed nothing.")
		default:
			parts = append(parts, subject+" printed:\n\n"+out)
		}
	}
	return strings.Join(parts, "\n\n")
}

// withoutCLIHints is a tool result without the paragraphs Claude Code
// appends to it for the model: to an error of a deferred (MCP) tool called
// before its schema was loaded, "This tool's input schema was not in your
// prompt when you called it. The input schema is: {…}" and advice ending
// "call ToolSearch with query …" (2.1.332). They are words to the model,
// not the tool's output, and the demo quotes only the output.
func withoutCLIHints(s string) string {
	if i := strings.Index(s, cliSchemaHint); i >= 0 {
		s = s[:i]
	}
	paras := strings.Split(strings.TrimRight(s, "\n"), "\n\n")
	for len(paras) > 1 && strings.Contains(paras[len(paras)-1], "ToolSearch") {
		paras = paras[:len(paras)-1]
	}
	return strings.Join(paras, "\n\n")
}

// cliSchemaHint opens the paragraph the CLI appends to a deferred tool's
// error.
const cliSchemaHint = "This tool's input schema was not in your prompt when you called it."

// mentionsSubagent reports whether a prompt asks for a sub-agent.
func mentionsSubagent(text string) bool {
	t := strings.ToLower(text)
	return strings.Contains(t, "subagent") || strings.Contains(t, "sub-agent")
}

// subagentReport returns the sub-agent's report from an Agent call's
// result. Claude Code 2.1.332 frames it: notes, a paragraph ending "The
// report follows:", the report indented by two spaces, then "agentId: …"
// and a <usage> block. Without that frame the whole result is the report.
func subagentReport(result string) string {
	_, rest, ok := strings.Cut(result, "The report follows:\n")
	if !ok {
		return strings.TrimSpace(result)
	}
	if i := strings.Index(rest, "\nagentId: "); i >= 0 {
		rest = rest[:i]
	}
	lines := strings.Split(rest, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "  ")
	}
	return strings.TrimSpace(strings.Join(lines, "\n"))
}

// cutPrefixFold is strings.CutPrefix ignoring ASCII/Unicode case.
func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return s, false
	}
	return s[len(prefix):], true
}

// backtickCommand returns the first non-empty span between single
// backticks, trimmed, or "".
func backtickCommand(s string) string {
	for {
		open := strings.IndexByte(s, '`')
		if open < 0 {
			return ""
		}
		rest := s[open+1:]
		end := strings.IndexByte(rest, '`')
		if end < 0 {
			return ""
		}
		if cmd := strings.TrimSpace(rest[:end]); cmd != "" {
			return cmd
		}
		s = rest[end+1:]
	}
}

// truncate shortens s to at most n characters (runes), adding "…" when it
// cut.
func truncate(s string, n int) string {
	count := 0
	for i := range s {
		if count == n {
			return s[:i] + "…"
		}
		count++
	}
	return s
}

// titleWords makes a short title from the title call's prompt
// ("<session>\n<prompt>\n</session>\n\nWrite the title …"): the first six
// words of the session part.
func titleWords(prompt string) string {
	if _, after, ok := strings.Cut(prompt, "<session>"); ok {
		prompt, _, _ = strings.Cut(after, "</session>")
	}
	words := strings.Fields(prompt)
	if len(words) > 6 {
		words = words[:6]
	}
	if len(words) == 0 {
		return "New session"
	}
	return truncate(strings.Join(words, " "), 80)
}

// schemaAnswer returns JSON text that satisfies a simple JSON schema,
// putting title into every string it has to produce (an object's
// required properties, or all of them when none are required).
func schemaAnswer(schema json.RawMessage, title string) string {
	b, err := marshal(schemaValue(schema, title, 0))
	if err != nil {
		b, _ = marshal(map[string]string{"title": title})
	}
	return string(b)
}

func schemaValue(schema json.RawMessage, title string, depth int) any {
	var s struct {
		Type       json.RawMessage            `json:"type"`
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
		Enum       []json.RawMessage          `json:"enum"`
	}
	_ = json.Unmarshal(schema, &s) // lenient: an odd schema gets a string
	if len(s.Enum) > 0 {
		return s.Enum[0]
	}
	var typ string
	if json.Unmarshal(s.Type, &typ) != nil {
		var types []string // e.g. ["string","null"]
		if json.Unmarshal(s.Type, &types) == nil && len(types) > 0 {
			typ = types[0]
		}
	}
	if typ == "" && s.Properties != nil {
		typ = "object"
	}
	switch typ {
	case "object":
		out := map[string]any{}
		if depth >= 8 {
			return out
		}
		names := s.Required
		if len(names) == 0 {
			for n := range s.Properties {
				names = append(names, n)
			}
			sort.Strings(names)
		}
		for _, n := range names {
			out[n] = schemaValue(s.Properties[n], title, depth+1)
		}
		return out
	case "array":
		return []any{}
	case "integer", "number":
		return 0
	case "boolean":
		return false
	case "null":
		return nil
	}
	return title
}
