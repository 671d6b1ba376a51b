package e2e

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/platformtest"
)

// These tests are issue 9's cases C1 and C5, played by a conversation's
// agent against the whole platform (the worker runs as root, so each agent
// has a uid of its own and a jail). C2 and C3 are in agentpaths_test.go, C4
// in internal/worker/harness (TestAgentCannotLoosenThePermissionPolicy, with the
// real CLI), the limits of C6 in internal/worker/harness (TestAgentLimits,
// TestAgentDiskLimit).

func waitProcesses(t *testing.T, prefix string, want func(n int) bool, what string) {
	t.Helper()
	// A bound for a hung run, not a speed requirement: a loaded CI machine
	// starts a CLI in seconds.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		left := platformtest.HostProcesses(prefix)
		if want(len(left)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %q on the host: %v", what, prefix, left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// detach is what an agent runs to leave processes behind: one in a session
// of its own, one that also cleared its environment (no marker to find it
// by), one under nohup, and a double fork, all with their output away from
// the tool's pipe.
func detach(marker string) string {
	return "setsid sleep " + marker + "1 >/dev/null 2>&1 & setsid env -i sleep " + marker + "2 >/dev/null 2>&1 & " +
		"nohup sleep " + marker + "3 >/dev/null 2>&1 & (sh -c 'sleep " + marker + "4 >/dev/null 2>&1 &' &); echo detached-" + marker
}

// cliPID returns the host pid of the CLI of conv (a process whose
// environment routes model calls to conv).
func cliPID(t *testing.T, conv string) int {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(cmd), "--permission-prompt-tool") || strings.Contains(string(cmd), "bwrap") {
			continue
		}
		env, _ := os.ReadFile("/proc/" + e.Name() + "/environ")
		for _, kv := range strings.Split(string(env), "\x00") {
			if strings.HasPrefix(kv, "ANTHROPIC_BASE_URL=") && strings.HasSuffix(kv, "/"+conv) {
				var pid int
				for _, c := range e.Name() {
					pid = pid*10 + int(c-'0')
				}
				return pid
			}
		}
	}
	t.Fatalf("no CLI process of %s", conv)
	return 0
}

// TestDetachedProcessesEndWithTheirConversation is case C1: whatever way an
// agent detaches processes, they end when its CLI ends: on stop (the idle
// stop's path), on interrupt (what the turn detached), when the CLI
// crashes, and when the worker stops (a platform stop or redeploy).
func TestDetachedProcessesEndWithTheirConversation(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	wc := p.WorkerClient()
	ctx := context.Background()
	cases := []struct {
		name, marker string
		long         bool // the command keeps the turn running
		end          func(conv string)
	}{
		{"stop", "87361", false, func(conv string) {
			if _, err := wc.Stop(ctx, conv); err != nil {
				t.Fatal(err)
			}
		}},
		{"interrupt", "87362", true, func(conv string) {
			if code := p.Do("POST", "/api/conversations/"+conv+"/interrupt", map[string]any{}, nil); code/100 != 2 {
				t.Fatalf("interrupt: %d", code)
			}
		}},
		{"cli crash", "87363", false, func(conv string) {
			if err := syscall.Kill(cliPID(t, conv), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}},
		{"worker stop", "87364", false, func(string) { p.RestartWorker() }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conv := p.NewConversation()
			s := p.OpenStream(conv, 0)
			cmd := detach(c.marker)
			if c.long {
				cmd += "; sleep 120"
			}
			p.Send(conv, "please run `"+cmd+"`")
			waitProcesses(t, "sleep "+c.marker, func(n int) bool { return n == 4 }, "the agent's detached processes did not start")
			if !c.long {
				if end := s.Until(3*time.Minute, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
					t.Fatalf("turn: %s %s", end.Type, end.Data)
				}
			}
			c.end(conv)
			waitProcesses(t, "sleep "+c.marker, func(n int) bool { return n == 0 }, "processes outlived their conversation's CLI ("+c.name+")")
		})
	}
}

// TestAgentsSeeOnlyTheirOwnProcesses is case C5: one conversation's agent
// cannot read another's command lines or environments (a token exported in
// a command), and no secret travels in a command line: the MCP
// configuration is a file, not a --mcp-config argument.
func TestAgentsSeeOnlyTheirOwnProcesses(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	// (The probe's patterns are written so its own command line does not
	// match them.)
	b := p.NewConversation()
	p.OpenStream(b, 0)
	p.Send(b, "please run `export GITHUB_TOKEN=ghp_example_c5; sh -c 'sleep 873651; : ghp_example_c5'`")
	waitProcesses(t, "sleep 873651", func(n int) bool { return n == 1 }, "conversation b's command did not start")

	a := p.NewConversation()
	sa := p.OpenStream(a, 0)
	p.Send(a, "please run `echo procs=$(ls /proc | grep -c '^[0-9]'); cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c -e 'ghp_exam[p]le_c5' -e '8736[5]1' -e 'mcpServ[e]rs'; echo probe-done`")
	if end := sa.Until(3*time.Minute, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
		t.Fatalf("a's turn: %s %s", end.Type, end.Data)
	}
	var out string
	for _, ev := range sa.Events {
		if ev.Type == contract.EventToolResult {
			out = platformtest.Payload[contract.ToolResult](t, ev).Content
		}
	}
	lines := strings.Fields(out)
	if len(lines) != 3 || lines[2] != "probe-done" {
		t.Fatalf("probe output: %q", out)
	}
	if lines[1] != "0" {
		t.Errorf("conversation a read %s lines of conversation b's command line or environment (or an MCP configuration)", lines[1])
	}
	if n := strings.TrimPrefix(lines[0], "procs="); len(n) > 1 {
		t.Errorf("conversation a sees %s processes; want only its own few", n)
	}
	// From the host: no process carries an MCP configuration in its
	// arguments.
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && strings.Contains(string(b), "mcpServers") {
			t.Errorf("process %s has an MCP configuration in its command line", e.Name())
		}
	}
}
