// Command standin is a light stand-in for the Claude Code CLI, for
// bench-worker: it speaks the CLI's stream-json protocol on stdin and stdout
// (as internal/worker/streamjson reads it and internal/worker/harness drives it)
// without a model. `--version` prints the pinned version, so a worker accepts
// it as its CLI. Every control request (initialize, interrupt, ...) is
// answered with success. Every user message runs a scripted turn:
// system/init, then `lines` assistant text lines `gap` apart, then a
// successful result. The message text sets the script:
//
//	bench lines=10 gap=100ms
//
// With burst=1 the assistant lines and the result are written together,
// with one write (as a CLI's output piles up in its pipe while its reader
// is busy).
//
// Each assistant text is "bench-ts=<unix nanoseconds> i=<n>", the time taken
// just before the line is written to stdout, so a reader can tell how long
// the line took to reach it.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/talkide/talkide/internal/worker/claudecli"
	"github.com/talkide/talkide/internal/worker/streamjson"
)

func main() {
	session := uuid.NewString()
	args := os.Args[1:]
	for i, a := range args {
		switch {
		case a == "--version" || a == "-v":
			fmt.Println(claudecli.PinnedVersion + " (Claude Code)")
			return
		case (a == "--session-id" || a == "--resume") && i+1 < len(args):
			session = args[i+1]
		}
	}
	cwd, _ := os.Getwd()
	if err := serve(os.Stdin, os.Stdout, session, cwd); err != nil {
		fmt.Fprintln(os.Stderr, "standin:", err)
		os.Exit(1)
	}
}

// Script is one turn's shape, read from the message text.
type Script struct {
	Lines int
	Gap   time.Duration
	Burst bool
}

// ParseScript reads "lines=N gap=D burst=1" from text; missing keys keep
// 3 lines, no gap and no burst.
func ParseScript(text string) Script {
	s := Script{Lines: 3}
	for f := range strings.FieldsSeq(text) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		switch k {
		case "lines":
			if n, err := strconv.Atoi(v); err == nil && n >= 0 {
				s.Lines = n
			}
		case "gap":
			if d, err := time.ParseDuration(v); err == nil && d >= 0 {
				s.Gap = d
			}
		case "burst":
			s.Burst = v == "1"
		}
	}
	return s
}

// TextPrefix starts every assistant text; the unix nanoseconds follow.
const TextPrefix = "bench-ts="

// SentAt returns the write time embedded in an assistant text.
func SentAt(text string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(text, TextPrefix)
	if !ok {
		return time.Time{}, false
	}
	ns, _, _ := strings.Cut(rest, " ")
	n, err := strconv.ParseInt(ns, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, n), true
}

// serve answers stdin until it ends.
func serve(in io.Reader, out io.Writer, session, cwd string) error {
	w := bufio.NewWriter(out)
	emit := func(line []byte) error {
		if _, err := w.Write(line); err != nil {
			return err
		}
		return w.Flush()
	}
	r := streamjson.NewReader(in)
	turns := 0
	for {
		line, err := r.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var m struct {
			Type      string `json:"type"`
			RequestID string `json:"request_id"`
			Message   struct {
				Content json.RawMessage `json:"content"`
			} `json:"message"`
		}
		if err := json.Unmarshal(line, &m); err != nil {
			return fmt.Errorf("stdin line is not JSON: %w", err) // as the CLI: exit
		}
		switch m.Type {
		case "control_request":
			if err := emit(streamjson.ControlSuccess(m.RequestID, map[string]any{})); err != nil {
				return err
			}
		case "user":
			turns++
			if err := turn(emit, session, cwd, turns, ParseScript(contentText(m.Message.Content))); err != nil {
				return err
			}
		}
	}
}

// contentText returns a user message's content as text (a string, or the
// text blocks of a list).
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []streamjson.ContentBlock
	_ = json.Unmarshal(raw, &blocks)
	var parts []string
	for _, b := range blocks {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func turn(emit func([]byte) error, session, cwd string, n int, sc Script) (err error) {
	start := time.Now()
	line := func(v any) []byte {
		b, _ := json.Marshal(v)
		return append(b, '\n')
	}
	if err := emit(line(map[string]any{
		"type": "system", "subtype": "init", "session_id": session, "cwd": cwd, "model": "bench-standin",
		"permissionMode": "default", "apiKeySource": "none", "claude_code_version": claudecli.PinnedVersion,
		"tools": []string{}, "mcp_servers": []any{}, "uuid": uuid.NewString(),
	})); err != nil {
		return err
	}
	if sc.Burst {
		var all []byte
		write := emit
		emit = func(b []byte) error { all = append(all, b...); return nil }
		defer func() {
			if err == nil {
				err = write(all)
			}
		}()
	}
	msgID := fmt.Sprintf("msg_standin_%d", n)
	for i := range sc.Lines {
		if i > 0 && sc.Gap > 0 {
			time.Sleep(sc.Gap)
		}
		text := fmt.Sprintf("%s%d i=%d", TextPrefix, time.Now().UnixNano(), i)
		if err := emit(line(map[string]any{
			"type": "assistant", "session_id": session, "parent_tool_use_id": nil, "uuid": uuid.NewString(),
			"message": map[string]any{
				"id": msgID, "type": "message", "role": "assistant", "model": "bench-standin",
				"content":     []map[string]any{{"type": "text", "text": text}},
				"stop_reason": nil, "usage": map[string]any{"input_tokens": 10, "output_tokens": 1},
			},
		})); err != nil {
			return err
		}
	}
	return emit(line(map[string]any{
		"type": "result", "subtype": "success", "is_error": false, "result": "done", "session_id": session,
		"stop_reason": "end_turn", "num_turns": 1, "duration_ms": time.Since(start).Milliseconds(),
		"total_cost_usd": 0, "usage": map[string]any{"input_tokens": 10, "output_tokens": sc.Lines},
		"uuid": uuid.NewString(),
	}))
}
