package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/sse"
	"github.com/talkide/talkide/internal/worker/claudecli"
	"github.com/talkide/talkide/internal/worker/streamjson"
)

type turnsResult struct {
	direct, platform time.Duration // medians
	ratio            float64
}

// benchTurns times warm turns of the real CLI driven directly and through
// the whole platform, alternating, on the same development upstream.
func benchTurns(o options, work string) (turnsResult, error) {
	var r turnsResult
	bin, err := claudecli.Find()
	if err != nil {
		return r, err
	}
	dir, err := os.MkdirTemp(work, "turns-")
	if err != nil {
		return r, err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return r, err
	}
	p, err := startPlatform(dir, filepath.Join(dir, "sessions"), childConfig{ClaudeBin: bin, Containment: "strict", MaxProcesses: 4, MaxConversations: 1000, UIDCount: 100000})
	if err != nil {
		return r, err
	}
	defer p.close()

	d, err := startDirectCLI(bin, filepath.Join(dir, "direct"), p.upstream.URL)
	if err != nil {
		return r, err
	}
	defer d.close()

	conv, err := p.newConversation()
	if err != nil {
		return r, err
	}
	req, _ := http.NewRequest("GET", p.cpURL+"/api/conversations/"+conv+"/stream", nil)
	req.Header.Set("Authorization", "Bearer "+p.userToken)
	resp, err := p.hc.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return r, fmt.Errorf("open stream: %d", resp.StatusCode)
	}
	stream := sse.NewReader(bufio.NewReader(resp.Body))
	// accepted and started are, per platform turn, how long the browser
	// API took to accept the message and how long until its turn_started
	// reached the browser stream.
	var accepted, started []time.Duration
	// The tool call's marks are the worker's times of its events (taken as
	// it parsed the CLI's lines).
	platformTurn := func(text string) (time.Duration, toolMarks, error) {
		var m toolMarks
		t := time.Now()
		if _, err := p.api("POST", "/api/conversations/"+conv+"/messages", map[string]string{"text": text}, nil); err != nil {
			return 0, m, err
		}
		accepted = append(accepted, time.Since(t))
		for {
			e, err := stream.Next()
			if err != nil {
				return 0, m, err
			}
			switch contract.EventType(e.Type) {
			case contract.EventTurnStarted:
				started = append(started, time.Since(t))
			case contract.EventToolUse, contract.EventToolResult:
				var ev contract.Event
				if err := json.Unmarshal(e.Data, &ev); err != nil {
					return 0, m, err
				}
				if ev.Type == contract.EventToolUse {
					m.use = ev.Time
				} else {
					m.result = ev.Time
				}
			case contract.EventTurnCompleted:
				return time.Since(t), m, nil
			case contract.EventTurnFailed:
				return 0, m, fmt.Errorf("turn failed: %s", e.Data)
			}
		}
	}

	var ds, ps []time.Duration
	var dparts, pparts []turnParts
	for i := range o.warmup + o.turns {
		text := fmt.Sprintf("please run `echo bench-turn-%d`", i)
		// Alternate which goes first, so neither always follows the other.
		kinds := []func(string) (time.Duration, toolMarks, error){d.turn, platformTurn}
		outs := []*[]time.Duration{&ds, &ps}
		parts := []*[]turnParts{&dparts, &pparts}
		if i%2 == 1 {
			kinds[0], kinds[1] = kinds[1], kinds[0]
			outs[0], outs[1] = outs[1], outs[0]
			parts[0], parts[1] = parts[1], parts[0]
		}
		for k, f := range kinds {
			sent := time.Now()
			dt, marks, err := f(text)
			if err != nil {
				return r, err
			}
			if i >= o.warmup {
				*outs[k] = append(*outs[k], dt)
				if tp, ok := split(sent, time.Now(), modelCalls.within(sent, time.Now()), marks); ok {
					*parts[k] = append(*parts[k], tp)
				}
			}
		}
	}
	r.direct, r.platform = pct(ds, 50), pct(ps, 50)
	r.ratio = float64(r.platform) / float64(r.direct)
	fmt.Printf("# turns: real Claude Code CLI %s, development upstream, prompt \"please run `echo bench-turn-N`\" (a Bash call and an answer quoting it: two model calls); %d warm-up turns of each, then %d of each alternating\n",
		claudecli.PinnedVersion, o.warmup, o.turns)
	fmt.Printf("# direct: the bench drives the CLI over stream-json (allowing the Bash call), model calls straight to the upstream; platform: browser API → control plane → worker → CLI in its jail as its own uid → local gateway proxy → control plane gateway → upstream, events back to the browser stream\n")
	fmt.Printf("%-10s %10s %10s %10s\n", "kind", "p50_ms", "min_ms", "max_ms")
	for _, k := range []struct {
		name string
		d    []time.Duration
	}{{"direct", ds}, {"platform", ps}} {
		fmt.Printf("%-10s %10.1f %10.1f %10.1f\n", k.name, ms(pct(k.d, 50)), ms(pct(k.d, 0)), ms(pct(k.d, 100)))
	}
	fmt.Printf("# added per turn (medians) %.1f ms, ratio %.2f\n", ms(r.platform-r.direct), r.ratio)
	// Where the time goes: the parts of a turn, split at the model calls
	// as the upstream saw them (medians of each part).
	part := func(ps []turnParts, f func(turnParts) time.Duration, toolOnly bool) float64 {
		var d []time.Duration
		for _, p := range ps {
			if p.hasTool || !toolOnly {
				d = append(d, f(p))
			}
		}
		return ms(pct(d, 50))
	}
	fmt.Printf("%-36s %10s %10s %10s\n", "part of a turn (medians)", "direct_ms", "platform", "added")
	for _, k := range []struct {
		name string
		f    func(turnParts) time.Duration
		tool bool
	}{
		{"message sent → first model call", func(p turnParts) time.Duration { return p.before }, false},
		{"in model calls (upstream's view)", func(p turnParts) time.Duration { return p.calls }, false},
		{"between calls (tool, next call in)", func(p turnParts) time.Duration { return p.between }, false},
		{"  first call answered → tool_use", func(p turnParts) time.Duration { return p.toUse }, true},
		{"  tool_use → tool_result", func(p turnParts) time.Duration { return p.tool }, true},
		{"  tool_result → second call", func(p turnParts) time.Duration { return p.toCall }, true},
		{"last call answered → turn seen done", func(p turnParts) time.Duration { return p.after }, false},
	} {
		dv, pv := part(dparts, k.f, k.tool), part(pparts, k.f, k.tool)
		fmt.Printf("%-36s %10.1f %10.1f %+10.1f\n", k.name, dv, pv, pv-dv)
	}
	fmt.Printf("# platform: the browser API accepted a message in %.1f ms and its turn_started reached the browser stream %.1f ms after it was sent (medians)\n",
		ms(pct(accepted, 50)), ms(pct(started, 50)))
	return r, nil
}

// directCLI is the real CLI driven by the bench over stream-json.
type directCLI struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan streamjson.Message
}

func startDirectCLI(bin, dir, upstream string) (*directCLI, error) {
	for _, d := range []string{"work", "config", "home", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(bin, "--output-format", "stream-json", "--verbose", "--input-format", "stream-json",
		"--permission-prompt-tool", "stdio", "--permission-mode", "default", "--setting-sources=",
		"--session-id", uuid.NewString())
	cmd.Dir = filepath.Join(dir, "work")
	// As the harness's environment (internal/worker/harness/env.go), with the
	// upstream's key instead of a placeholder for the local proxy.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "NO_PROXY=127.0.0.1,localhost",
		"ANTHROPIC_BASE_URL=" + upstream, "ANTHROPIC_AUTH_TOKEN=" + upstreamAPIKey,
		"CLAUDE_CONFIG_DIR=" + filepath.Join(dir, "config"), "HOME=" + filepath.Join(dir, "home"),
		"CLAUDE_CODE_TMPDIR=" + filepath.Join(dir, "tmp"), "TMPDIR=" + filepath.Join(dir, "tmp"),
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_TELEMETRY=1", "DISABLE_AUTOUPDATER=1", "BUN_ENABLE_CRASH_REPORTING=0"}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &directCLI{cmd: cmd, in: in, lines: make(chan streamjson.Message, 64)}
	go func() {
		defer close(d.lines)
		r := streamjson.NewReader(out)
		for {
			line, err := r.Next()
			if err != nil {
				return
			}
			m, err := streamjson.Parse(line)
			if err != nil {
				continue
			}
			if c, ok := m.(*streamjson.ControlRequest); ok {
				// Allow the tool call, as the harness's allow policy does.
				var req struct {
					Input     json.RawMessage `json:"input"`
					ToolUseID string          `json:"tool_use_id"`
				}
				_ = json.Unmarshal(c.Request, &req)
				if len(req.Input) == 0 {
					req.Input = json.RawMessage("{}")
				}
				_, _ = in.Write(streamjson.ControlSuccess(c.RequestID, map[string]any{"behavior": "allow", "updatedInput": req.Input, "toolUseID": req.ToolUseID}))
				continue
			}
			d.lines <- m
		}
	}()
	return d, nil
}

// turn runs one turn; the tool call's marks are when the bench read the
// lines with the tool_use and the tool_result.
func (d *directCLI) turn(text string) (time.Duration, toolMarks, error) {
	var tm toolMarks
	t := time.Now()
	if _, err := d.in.Write(streamjson.UserInput(text, uuid.NewString())); err != nil {
		return 0, tm, err
	}
	for m := range d.lines {
		switch m := m.(type) {
		case *streamjson.Assistant:
			for _, b := range m.Message.Blocks() {
				if b.Type == "tool_use" {
					tm.use = time.Now()
				}
			}
		case *streamjson.User:
			tm.result = time.Now()
		case *streamjson.Result:
			if m.IsError {
				return 0, tm, fmt.Errorf("direct turn failed: %s %v", m.Result, m.Errors)
			}
			return time.Since(t), tm, nil
		}
	}
	return 0, tm, fmt.Errorf("the CLI exited")
}

func (d *directCLI) close() {
	d.in.Close()
	done := make(chan struct{})
	go func() { d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		d.cmd.Process.Kill()
		<-done
	}
}
