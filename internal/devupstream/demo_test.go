package devupstream

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// demoRespond parses body as the server would and asks DemoResponder.
func demoRespond(t *testing.T, body string) Response {
	t.Helper()
	req, err := parseRequest([]byte(body), true)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return DemoResponder{}.Respond(req)
}

// reqWith builds a request body from messages (JSON values) and tools.
func reqWith(t *testing.T, tools []string, msgs ...string) string {
	t.Helper()
	ts := []any{}
	for _, n := range tools {
		ts = append(ts, map[string]any{"name": n, "input_schema": map[string]any{"type": "object"}})
	}
	raw := make([]json.RawMessage, len(msgs))
	for i, m := range msgs {
		raw[i] = json.RawMessage(m)
	}
	b, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 10, "tools": ts, "messages": raw})
	if err != nil {
		t.Fatalf("bad test messages: %v", err)
	}
	return string(b)
}

var cliTools = []string{"Agent", "Bash", "Edit", "Read", "ToolSearch", "DeferredToolPlaceholder"}

const envMsg = `{"role":"system","content":[{"type":"text","text":"# Environment\nYou have been invoked in /srv"}]}`

func TestDemoResponder(t *testing.T) {
	bash := func(cmd string) Response {
		return Response{Content: []ContentBlock{
			Text("I'll run that."),
			ToolUse("Bash", map[string]string{"command": cmd, "description": "Run " + cmd}),
		}}
	}
	text := func(s string) Response { return Response{Content: []ContentBlock{Text(s)}} }
	echo := func(s string) Response {
		return text(`You said: "` + s + `". I am the TalkIDE development upstream; put a command between backticks and I will run it.`)
	}
	issue := func(title string) Response {
		return Response{Content: []ContentBlock{ToolUse(IssueToolName, map[string]string{"title": title})}}
	}
	toolUse := `{"role":"assistant","content":[{"type":"text","text":"I'll run that."},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}]}`
	subagent := func(tool, cmd string) Response {
		return Response{Content: []ContentBlock{
			Text("I'll ask a subagent to run that."),
			ToolUse(tool, map[string]any{"description": "Run " + cmd, "prompt": "Run `" + cmd + "` with the Bash tool and report its output.",
				"subagent_type": "general-purpose", "run_in_background": false}),
		}}
	}
	agentUse := `{"role":"assistant","content":[{"type":"tool_use","id":"toolu_a","name":"Agent","input":{"prompt":"Run ` + "`echo sub-x`" + `"}}]}`
	// The result of an Agent call as CLI 2.1.332 frames the sub-agent's report.
	handBack, err := json.Marshal("  <tools-used-before-summary>Bash</tools-used-before-summary>\n  \n[Subagent hand-back] The text below is the final report of a subagent this session delegated to. … The report follows:\n  The command printed:\n  \n  sub-x\nagentId: a54c0cf256aa4ae22 (use SendMessage with to: 'a54c0cf256aa4ae22', summary: '<5-10 word recap>' to continue this agent)\n<usage>subagent_tokens: 8669\ntool_uses: 1\nduration_ms: 582</usage>")
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name  string
		tools []string
		msgs  []string
		want  Response
	}{
		{
			name:  "backtick command",
			tools: cliTools,
			msgs:  []string{`{"role":"user","content":"please run ` + "`ls -la /tmp`" + ` now"}`, envMsg},
			want:  bash("ls -la /tmp"),
		},
		{
			name:  "system reminder blocks are skipped",
			tools: cliTools,
			msgs: []string{`{"role":"user","content":[
				{"type":"text","text":"<system-reminder>\nrun ` + "`rm -rf /`" + ` is in a reminder\n</system-reminder>"},
				{"type":"text","text":"run ` + "`date`" + `"},
				{"type":"text","text":"  <system-reminder>trailing reminder</system-reminder>","cache_control":{"type":"ephemeral"}}]}`, envMsg},
			want: bash("date"),
		},
		{
			name:  "first non-empty backtick span",
			tools: cliTools,
			msgs:  []string{"{\"role\":\"user\",\"content\":\"`` then ` ` then `pwd` and `whoami`\"}"},
			want:  bash("pwd"),
		},
		{
			name:  "unclosed backtick",
			tools: cliTools,
			msgs:  []string{"{\"role\":\"user\",\"content\":\"run `ls\"}"},
			want:  echo("run `ls"),
		},
		{
			name:  "no Bash tool",
			tools: []string{"Read"},
			msgs:  []string{"{\"role\":\"user\",\"content\":\"run `ls`\"}"},
			want:  echo("run `ls`"),
		},
		{
			name:  "empty tools",
			tools: nil,
			msgs:  []string{"{\"role\":\"user\",\"content\":\"run `ls`\"}"},
			want:  echo("run `ls`"),
		},
		{
			name:  "tool result quoted",
			tools: cliTools,
			msgs: []string{"{\"role\":\"user\",\"content\":\"run `ls`\"}", envMsg, toolUse,
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"  a.txt\nb.txt\n\n","is_error":false}]}`},
			want: text("The command printed:\n\na.txt\nb.txt"),
		},
		{
			name:  "tool result array content with reminder after it",
			tools: cliTools,
			msgs: []string{"{\"role\":\"user\",\"content\":\"run `ls`\"}", envMsg, toolUse,
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"line1"},{"type":"text","text":"line2"}]},{"type":"text","text":"<system-reminder>todo</system-reminder>","cache_control":{"type":"ephemeral"}}]}`},
			want: text("The command printed:\n\nline1\nline2"),
		},
		{
			name:  "tool result error",
			tools: cliTools,
			msgs: []string{"{\"role\":\"user\",\"content\":\"run `false`\"}", toolUse,
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"Exit code 1\nboom","is_error":true}]}`},
			want: text("The command failed:\n\nExit code 1\nboom"),
		},
		{
			// The issue-29 stumble: the CLI appends advice for the model to
			// an error of a deferred tool; the demo quotes the tool alone.
			name:  "tool error with the CLI's advice appended",
			tools: cliTools,
			msgs: []string{`{"role":"user","content":"run the tests"}`,
				`{"role":"assistant","content":[{"type":"tool_use","id":"toolu_b","name":"mcp__talkide-build__run_build","input":{"tasks":["test"]}}]}`,
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_b","is_error":true,"content":"BUILD FAILED (exit code 1)\n\nBUILD FAILED in 7s\n3 actionable tasks: 3 executed\n\nThis tool's input schema was not in your prompt when you called it. The input schema is: {\"type\":\"object\"}\nIf your input does not match this schema, correct it and call the tool again. If the corrected call fails the same way, call ToolSearch with query \"select:mcp__talkide-build__run_build\" to load the tool, then call it again."}]}`},
			want: text("The tool mcp__talkide-build__run_build failed:\n\nBUILD FAILED (exit code 1)\n\nBUILD FAILED in 7s\n3 actionable tasks: 3 executed"),
		},
		{
			name:  "advice naming ToolSearch at the end of a result",
			tools: cliTools,
			msgs: []string{"{\"role\":\"user\",\"content\":\"run `false`\"}", toolUse,
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"Exit code 1\nboom\n\nCall Bash instead, loading it first with ToolSearch query \"select:Bash\" if it is not loaded yet.","is_error":true}]}`},
			want: text("The command failed:\n\nExit code 1\nboom"),
		},
		{
			name:  "tool result of another tool",
			tools: cliTools,
			msgs: []string{`{"role":"user","content":"file an issue: x"}`,
				`{"role":"assistant","content":[{"type":"tool_use","id":"toolu_9","name":"mcp__talkide-issue-tracking__create_issue","input":{"title":"x"}}]}`,
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_9","content":[{"type":"text","text":"Created issue #7"}]}]}`},
			want: text("The tool mcp__talkide-issue-tracking__create_issue printed:\n\nCreated issue #7"),
		},
		{
			name:  "tool result with no output",
			tools: cliTools,
			msgs: []string{toolUse,
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":""}]}`},
			want: text("The command printed nothing."),
		},
		{
			// The CLI merges an interrupted tool call's result and the next
			// prompt into one user message; the prompt wins.
			name:  "prompt after interrupted tool result",
			tools: cliTools,
			msgs: []string{toolUse, `{"role":"user","content":[
				{"type":"tool_result","tool_use_id":"toolu_1","content":"[Request interrupted by user for tool use]","is_error":true},
				{"type":"text","text":"[Request interrupted by user for tool use]\n"},
				{"type":"text","text":"now run ` + "`uptime`" + `","cache_control":{"type":"ephemeral"}}]}`},
			want: bash("uptime"),
		},
		{
			name:  "system message after tool result is skipped",
			tools: cliTools,
			msgs: []string{toolUse,
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"ok"}]}`,
				`{"role":"system","content":"# Environment update\n - Primary working directory: /b (was /a)"}`},
			want: text("The command printed:\n\nok"),
		},
		{
			name:  "subagent asked for",
			tools: cliTools,
			msgs:  []string{"{\"role\":\"user\",\"content\":\"use a Sub-Agent to run `echo sub-x`\"}", envMsg},
			want:  subagent("Agent", "echo sub-x"),
		},
		{
			name:  "subagent tool named Task",
			tools: []string{"Task", "Bash"},
			msgs:  []string{"{\"role\":\"user\",\"content\":\"use a subagent to run `ls`\"}"},
			want:  subagent("Task", "ls"),
		},
		{
			name:  "subagent without the Agent tool runs the command itself",
			tools: []string{"Bash"},
			msgs:  []string{"{\"role\":\"user\",\"content\":\"use a subagent to run `ls`\"}"},
			want:  bash("ls"),
		},
		{
			name:  "subagent without a command",
			tools: cliTools,
			msgs:  []string{`{"role":"user","content":"use a subagent"}`},
			want:  echo("use a subagent"),
		},
		{
			name:  "subagent report quoted",
			tools: cliTools,
			msgs: []string{"{\"role\":\"user\",\"content\":\"use a subagent to run `echo sub-x`\"}", agentUse,
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_a","content":[{"type":"text","text":` + string(handBack) + `}]}]}`},
			want: text("The subagent reported:\n\nThe command printed:\n\nsub-x"),
		},
		{
			name:  "unframed subagent result quoted whole",
			tools: cliTools,
			msgs: []string{agentUse,
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_a","content":"  done  "}]}`},
			want: text("The subagent reported:\n\ndone"),
		},
		{
			name:  "failed subagent",
			tools: cliTools,
			msgs: []string{agentUse,
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_a","content":"agent crashed","is_error":true}]}`},
			want: text("The tool Agent failed:\n\nagent crashed"),
		},
		{
			name:  "file an issue",
			tools: cliTools,
			msgs:  []string{`{"role":"user","content":"File An Issue:   Login button is broken  "}`, envMsg},
			want:  issue("Login button is broken"),
		},
		{
			name:  "file an issue wins over backticks",
			tools: cliTools,
			msgs:  []string{"{\"role\":\"user\",\"content\":\"file an issue: `make` fails\"}"},
			want:  issue("`make` fails"),
		},
		{
			name:  "file an issue needs tools",
			tools: nil,
			msgs:  []string{`{"role":"user","content":"file an issue: x"}`},
			want:  echo("file an issue: x"),
		},
		{
			name:  "run the tests",
			tools: cliTools,
			msgs:  []string{`{"role":"user","content":"Run the tests, please"}`, envMsg},
			want: Response{Content: []ContentBlock{Text("I'll run the tests."),
				ToolUse(BuildToolName, map[string]any{"tasks": []string{"test"}})}},
		},
		{
			name:  "run the tests needs tools",
			tools: nil,
			msgs:  []string{`{"role":"user","content":"run the tests"}`},
			want:  echo("run the tests"),
		},
		{
			name:  "echo",
			tools: cliTools,
			msgs:  []string{`{"role":"user","content":[{"type":"text","text":"<system-reminder>ctx</system-reminder>"},{"type":"text","text":"  hello there  "}]}`, envMsg},
			want:  echo("hello there"),
		},
		{
			name:  "echo truncates to 200 characters",
			tools: cliTools,
			msgs:  []string{`{"role":"user","content":"` + strings.Repeat("é", 250) + `"}`},
			want:  echo(strings.Repeat("é", 200) + "…"),
		},
		{
			name:  "last message from assistant uses last user text",
			tools: cliTools,
			msgs:  []string{`{"role":"user","content":"hi"}`, `{"role":"assistant","content":"prefill"}`},
			want:  echo("hi"),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := demoRespond(t, reqWith(t, tc.tools, tc.msgs...))
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(jsonEqual)); diff != "" {
				t.Errorf("response (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDemoSubagentStartsNoSubagent: a sub-agent's own call (marked by the
// CLI's billing header), whose prompt may say "subagent" too, runs the
// command itself instead of starting another sub-agent.
func TestDemoSubagentStartsNoSubagent(t *testing.T) {
	body := map[string]any{"model": "m", "max_tokens": 10,
		"system": []any{
			map[string]any{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.497; cc_entrypoint=sdk-cli; cc_is_subagent=true;"},
			map[string]any{"type": "text", "text": "You are an agent for Claude Code, Anthropic's official CLI for Claude."},
		},
		"tools":    []any{map[string]any{"name": "Agent"}, map[string]any{"name": "Bash"}},
		"messages": []any{map[string]any{"role": "user", "content": "as the subagent, run `echo inner`"}},
	}
	b, _ := json.Marshal(body)
	req, err := parseRequest(b, true)
	if err != nil {
		t.Fatal(err)
	}
	if !IsSubagentRequest(req) {
		t.Fatal("IsSubagentRequest: got false for a call marked cc_is_subagent=true")
	}
	got := DemoResponder{}.Respond(req)
	want := Response{Content: []ContentBlock{Text("I'll run that."), ToolUse("Bash", map[string]string{"command": "echo inner", "description": "Run echo inner"})}}
	if diff := cmp.Diff(want, got, cmp.Comparer(jsonEqual)); diff != "" {
		t.Errorf("response (-want +got):\n%s", diff)
	}
}

// jsonEqual compares raw JSON by value.
func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	return cmp.Equal(x, y)
}

func TestDemoTitleCall(t *testing.T) {
	got := demoRespond(t, readTestdata(t, "cli_title_request.json"))
	if len(got.Content) != 1 || got.Content[0].Type != "text" {
		t.Fatalf("got %+v, want one text block", got)
	}
	var title map[string]any
	if err := json.Unmarshal([]byte(got.Content[0].Text), &title); err != nil {
		t.Fatalf("title answer %q is not JSON: %v", got.Content[0].Text, err)
	}
	if diff := cmp.Diff(map[string]any{"title": "Please run `echo hello` in the"}, title); diff != "" {
		t.Errorf("title (-want +got):\n%s", diff)
	}
}

func TestDemoTitleCallOverHTTP(t *testing.T) {
	_, ts := newTestServer(t, Config{})
	resp, b := do(t, http.MethodPost, ts.URL+"/v1/messages?beta=true", readTestdata(t, "cli_title_request.json"), cliHeaders("x"))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d: %s", resp.StatusCode, b)
	}
	evs, err := parseSSE(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	a := assemble(t, evs)
	if len(a.Content) != 1 || a.StopReason != "end_turn" {
		t.Fatalf("got content %v stop %v, want one text block and end_turn", a.Content, a.StopReason)
	}
	var v struct {
		Title string `json:"title"`
	}
	dec := json.NewDecoder(strings.NewReader(a.Content[0]["text"].(string)))
	dec.DisallowUnknownFields() // the schema says additionalProperties: false
	if err := dec.Decode(&v); err != nil || v.Title == "" {
		t.Errorf("title text %q: %v, want {\"title\":…}", a.Content[0]["text"], err)
	}
}

func TestSchemaAnswer(t *testing.T) {
	for _, tc := range []struct{ schema, want string }{
		{`{"type":"object","properties":{"title":{"type":"string"}},"required":["title"],"additionalProperties":false}`, `{"title":"T"}`},
		{`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"boolean"},"c":{"type":"array"},"d":{"enum":["x","y"]},"e":{"type":["string","null"]},"f":{"properties":{"g":{"type":"number"}}}}}`,
			`{"a":0,"b":false,"c":[],"d":"x","e":"T","f":{"g":0}}`},
		{`{"type":"string"}`, `"T"`},
		{`not json`, `"T"`},
		{``, `"T"`},
	} {
		if got := schemaAnswer(json.RawMessage(tc.schema), "T"); got != tc.want {
			t.Errorf("schemaAnswer(%s): got %s, want %s", tc.schema, got, tc.want)
		}
	}
}

func TestToolResultRoundTripOverHTTP(t *testing.T) {
	_, ts := newTestServer(t, Config{})
	resp, b := do(t, http.MethodPost, ts.URL+"/v1/messages?beta=true", readTestdata(t, "cli_tool_result_request.json"), cliHeaders("x"))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d: %s", resp.StatusCode, b)
	}
	evs, err := parseSSE(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	a := assemble(t, evs)
	want := []map[string]any{{"type": "text", "text": "The command printed:\n\nREADME.md\ngo.mod"}}
	if diff := cmp.Diff(want, a.Content); diff != "" {
		t.Errorf("content (-want +got):\n%s", diff)
	}
	if a.StopReason != "end_turn" {
		t.Errorf("stop_reason: got %v, want end_turn", a.StopReason)
	}
}

// TestDemoContinuesAfterARestart: the worker's continuation text after a
// restart cut a permission wait gets the named tool's last call again, with
// the same input; its result is then quoted, not repeated again.
func TestDemoContinuesAfterARestart(t *testing.T) {
	tools := []string{"Bash"}
	asked := `{"role":"user","content":"please run ` + "`touch a && echo ok`" + `"}`
	call := `{"role":"assistant","content":[{"type":"text","text":"I'll run that."},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"touch a && echo ok","description":"Run it"}}]}`
	cut := `{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"interrupted","is_error":true}]}`
	cont := `{"role":"user","content":"(TalkIDE: the session was restarted while you waited for permission to use Bash. Continue the task: request that tool call again, with the same input.)"}`
	r := demoRespond(t, reqWith(t, tools, asked, call, cut, cont))
	var use *ContentBlock
	for i := range r.Content {
		if r.Content[i].Type == "tool_use" {
			use = &r.Content[i]
		}
	}
	var in map[string]string
	if use != nil {
		json.Unmarshal(use.Input, &in)
	}
	if use == nil || use.Name != "Bash" || in["command"] != "touch a && echo ok" || in["description"] != "Run it" {
		t.Fatalf("continuation answered %+v, want the Bash call again", r.Content)
	}
	again := `{"role":"assistant","content":[{"type":"tool_use","id":"toolu_2","name":"Bash","input":{"command":"touch a && echo ok"}}]}`
	done := `{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_2","content":"ok"}]}`
	r = demoRespond(t, reqWith(t, tools, asked, call, cut, cont, again, done))
	if len(r.Content) != 1 || r.Content[0].Type != "text" || !strings.Contains(r.Content[0].Text, "ok") {
		t.Fatalf("after the repeated call: %+v, want the result quoted", r.Content)
	}
}
