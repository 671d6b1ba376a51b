package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/platformtest"
)

// TestAgentWritesAndEditsAFile: the development upstream's file prompts
// make the real CLI create a file with Write and change it with Read then
// Edit, in the conversation's working tree, and the events carry the
// inputs a browser shows as diffs (file_path, content, old_string,
// new_string).
func TestAgentWritesAndEditsAFile(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	conv := p.NewConversation()
	stream := p.OpenStream(conv, 0)
	turn := func(text string) []contract.Event {
		t.Helper()
		from := len(stream.Events)
		p.Send(conv, text)
		if end := stream.Until(90*time.Second, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
			t.Fatalf("%q ended with %s: %s\n%s", text, end.Type, end.Data, platformtest.Summary(stream.Events))
		}
		return stream.Events[from:]
	}
	uses := func(evs []contract.Event) (map[string]contract.ToolUse, map[string]contract.ToolResult) {
		byName, results := map[string]contract.ToolUse{}, map[string]contract.ToolResult{}
		for _, ev := range evs {
			switch ev.Type {
			case contract.EventToolUse:
				u := platformtest.Payload[contract.ToolUse](t, ev)
				byName[u.Name] = u
			case contract.EventToolResult:
				r := platformtest.Payload[contract.ToolResult](t, ev)
				results[r.ToolUseID] = r
			}
		}
		return byName, results
	}

	evs := turn("create file `notes.txt` containing `first line`")
	byName, results := uses(evs)
	w, ok := byName["Write"]
	if !ok {
		t.Fatalf("no Write call: %s", platformtest.Summary(evs))
	}
	var in struct{ FilePath, Content string }
	json.Unmarshal(w.Input, &struct {
		FilePath *string `json:"file_path"`
		Content  *string `json:"content"`
	}{&in.FilePath, &in.Content})
	if r := results[w.ToolUseID]; r.IsError || !filepath.IsAbs(in.FilePath) || in.Content != "first line\n" {
		t.Fatalf("Write %s → %+v", w.Input, r)
	}
	if b, err := os.ReadFile(in.FilePath); err != nil || string(b) != "first line\n" {
		t.Fatalf("the file after Write: %q, %v", b, err)
	}

	evs = turn("in `notes.txt` replace `first` with `second`")
	byName, results = uses(evs)
	read, e := byName["Read"], byName["Edit"]
	if read.ToolUseID == "" || e.ToolUseID == "" || results[read.ToolUseID].IsError || results[e.ToolUseID].IsError {
		t.Fatalf("want a Read then an Edit, both succeeding: %s", platformtest.Summary(evs))
	}
	if !strings.Contains(string(e.Input), `"old_string":"first"`) || !strings.Contains(string(e.Input), `"new_string":"second"`) {
		t.Errorf("Edit input %s", e.Input)
	}
	if b, err := os.ReadFile(in.FilePath); err != nil || string(b) != "second line\n" {
		t.Fatalf("the file after Edit: %q, %v", b, err)
	}
}
