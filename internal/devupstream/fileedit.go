package devupstream

import (
	"path"
	"regexp"
	"strings"
)

var (
	createFileRE = regexp.MustCompile("(?is)^create (?:the )?file `([^`]+)` (?:containing|with) `([^`]*)`")
	replaceRE    = regexp.MustCompile("(?is)^in `([^`]+)` replace `([^`]+)` with `([^`]*)`")
	workDirRE    = regexp.MustCompile(`(?m)(?:Primary working directory|Working directory): (/\S+)`)
)

// fileEdit answers the file-edit prompts of DemoResponder: a Write for
// "create file `P` containing `T`"; a Read, then an Edit, for "in `P`
// replace `A` with `B`". ok is false when the newest user text is neither,
// or when the edit's tool calls are done (rule 2 then quotes the results).
func fileEdit(req *Request) (Response, bool) {
	text, since := userTextAndToolsSince(req.Messages)
	text = strings.TrimSpace(text)
	if m := createFileRE.FindStringSubmatch(text); m != nil && req.HasTool("Write") {
		if len(since) > 0 {
			return Response{}, false
		}
		p := absPath(req, m[1])
		return Response{Content: []ContentBlock{Text("I'll create " + m[1] + "."),
			ToolUse("Write", map[string]string{"file_path": p, "content": m[2] + "\n"})}}, true
	}
	if m := replaceRE.FindStringSubmatch(text); m != nil && req.HasTool("Edit") && req.HasTool("Read") {
		p := absPath(req, m[1])
		switch {
		case len(since) == 0:
			return Response{Content: []ContentBlock{Text("I'll read " + m[1] + " first."),
				ToolUse("Read", map[string]string{"file_path": p})}}, true
		case len(since) == 1 && since[0].name == "Read" && !since[0].failed:
			return Response{Content: []ContentBlock{Text("Now I'll make the change."),
				ToolUse("Edit", map[string]any{"file_path": p, "old_string": m[2], "new_string": m[3], "replace_all": false})}}, true
		}
	}
	return Response{}, false
}

// toolCall is a tool_use of the assistant and whether its result failed.
type toolCall struct {
	name   string
	failed bool
}

// userTextAndToolsSince returns the newest user text (as lastUserText) and
// the tool calls the assistant made after it, in order.
func userTextAndToolsSince(msgs []Message) (string, []toolCall) {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role != "user" || trailingToolResults(msgs[i].Content) != nil {
			continue
		}
		text := lastUserText(msgs[:i+1])
		var calls []toolCall
		index := map[string]int{}
		for _, m := range msgs[i+1:] {
			for _, b := range m.Content {
				switch b.Type {
				case "tool_use":
					index[b.ID] = len(calls)
					calls = append(calls, toolCall{name: b.Name})
				case "tool_result":
					if j, ok := index[b.ToolUseID]; ok && b.IsError {
						calls[j].failed = true
					}
				}
			}
		}
		return text, calls
	}
	return "", nil
}

// absPath makes p absolute against the working directory the CLI's system
// prompt names; p is returned as is when it is absolute or none is named.
func absPath(req *Request, p string) string {
	if path.IsAbs(p) {
		return p
	}
	for _, s := range req.System {
		if m := workDirRE.FindStringSubmatch(s); m != nil {
			return path.Join(m[1], p)
		}
	}
	for _, m := range req.Messages {
		for _, b := range m.Content {
			if b.Type == "text" {
				if w := workDirRE.FindStringSubmatch(b.Text); w != nil {
					return path.Join(w[1], p)
				}
			}
		}
	}
	return p
}

// continuationPrefix starts the text the worker sends when a restart cut a
// turn that waited for a permission (internal/worker/harness, permissions.go).
const continuationPrefix = "(TalkIDE: the session was restarted while you waited for permission to use "

// continueAfterRestart answers that text with the named tool's newest call
// again, same input, as a model asked to "request that tool call again"
// would; ok is false for any other text or when no such call is found, and
// once the repeated call has its result (rule 2 then quotes it).
func continueAfterRestart(req *Request) (Response, bool) {
	text, since := userTextAndToolsSince(req.Messages)
	rest, ok := cutPrefixFold(strings.TrimSpace(text), continuationPrefix)
	if !ok || len(since) > 0 {
		return Response{}, false
	}
	tools, _, _ := strings.Cut(rest, ". ")
	for i := len(req.Messages) - 1; i >= 0; i-- {
		m := req.Messages[i]
		if m.Role != "assistant" {
			continue
		}
		for j := len(m.Content) - 1; j >= 0; j-- {
			b := m.Content[j]
			if b.Type != "tool_use" || !strings.Contains(", "+tools+",", ", "+b.Name+",") {
				continue
			}
			input := b.Input
			if len(input) == 0 {
				input = []byte("{}")
			}
			return Response{Content: []ContentBlock{Text("I'll try that again."), {Type: "tool_use", Name: b.Name, Input: input}}}, true
		}
	}
	return Response{}, false
}
