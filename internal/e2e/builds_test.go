package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/platformtest"
)

// TestAgentRunsTheSampleProjectsTests drives the real CLI and the real
// Gradle (Debian's, which make tools installs): a conversation started from
// the java-calculator sample asks to "run the tests"; the agent calls the
// talkide-build tool, the worker runs Gradle in the conversation's working
// tree as its agent, in a jail, and the stream shows build_started, the
// build's log in build_progress events and a build_completed naming the
// failing test and its assertion; the agent gets the same in its tool
// result.
func TestAgentRunsTheSampleProjectsTests(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	if st, body := p.DoAs(p.UserToken, "POST", "/api/conversations", "application/json", `{"tenant":"demo","env":"dev","sample":"no-such-sample"}`); st != http.StatusBadRequest ||
		!strings.Contains(body.Error.Message, "java-calculator") {
		t.Errorf("an unknown sample: status %d %+v; want 400 naming the samples there are", st, body)
	}
	conv := p.NewConversationFrom("java-calculator")
	stream := p.OpenStream(conv, 0)
	p.Send(conv, "run the tests")
	end := stream.Until(5*time.Minute, platformtest.TurnEnd)
	if end.Type != contract.EventTurnCompleted {
		t.Fatalf("build turn ended with %s: %s", end.Type, end.Data)
	}
	// The demo's answer quotes the build, not the advice the CLI appends
	// for the model ("call ToolSearch with query …").
	if answer := platformtest.Payload[contract.TurnCompleted](t, end).Result; strings.Contains(answer, "ToolSearch") || !strings.Contains(answer, "expected:<8> but was:<4>") {
		t.Errorf("the answer quotes the CLI's internal advice or not the build:\n%s", answer)
	}
	var started contract.BuildStarted
	var done contract.BuildCompleted
	var lines []string
	toolUseID := ""
	for _, ev := range stream.Events {
		switch ev.Type {
		case contract.EventToolUse:
			if u := platformtest.Payload[contract.ToolUse](t, ev); u.Name == devupstream.BuildToolName {
				toolUseID = u.ToolUseID
			}
		case contract.EventBuildStarted:
			started = platformtest.Payload[contract.BuildStarted](t, ev)
		case contract.EventBuildProgress:
			lines = append(lines, platformtest.Payload[contract.BuildProgress](t, ev).Lines...)
		case contract.EventBuildCompleted:
			done = platformtest.Payload[contract.BuildCompleted](t, ev)
		}
	}
	if toolUseID == "" || started.BuildID != toolUseID || started.Runner != "local" || strings.Join(started.Tasks, ",") != "test" {
		t.Errorf("build_started %+v for tool call %q", started, toolUseID)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "CalculatorTest > raisesToAPower FAILED") {
		t.Errorf("the build's log in build_progress events:\n%s", strings.Join(lines, "\n"))
	}
	if done.BuildID != toolUseID || done.Phase != "failed" || done.ExitCode == 0 || done.Tests != 2 || done.Failures != 1 || len(done.Failed) != 1 ||
		done.Failed[0].Name != "raisesToAPower" || !strings.HasSuffix(done.Failed[0].Message, "expected:<8> but was:<4>") {
		t.Fatalf("build_completed %+v", done)
	}
	r := toolResultOf(t, stream.Events, devupstream.BuildToolName)
	if !r.IsError || !strings.Contains(r.Content, "FAILED com.acme.CalculatorTest.raisesToAPower: java.lang.AssertionError: expected:<8> but was:<4>") || !strings.Contains(r.Content, "Tests: 2 run, 1 failed") {
		t.Errorf("the agent's tool result: %+v", r)
	}
}

// TestInterruptStopsTheBuild interrupts a turn while its build runs (the
// real CLI waits in the build tool's call): the build is cancelled (its
// Gradle ends with it: no process of the build is left), the stream says
// so in build_completed, the turn fails as interrupted, and the
// conversation goes on.
func TestInterruptStopsTheBuild(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	conv := p.NewConversationFrom("java-calculator")
	stream := p.OpenStream(conv, 0)
	p.Send(conv, "run the tests")
	stream.Until(2*time.Minute, func(ev contract.Event) bool {
		return ev.Type == contract.EventBuildProgress && len(platformtest.Payload[contract.BuildProgress](t, ev).Lines) > 0 || platformtest.TurnEnd(ev)
	})
	var ir contract.InterruptResponse
	if st := p.Do("POST", "/api/conversations/"+conv+"/interrupt", nil, &ir); st != http.StatusAccepted || !ir.Interrupted {
		t.Fatalf("interrupt: status %d %+v", st, ir)
	}
	var done contract.BuildCompleted
	end := stream.Until(time.Minute, func(ev contract.Event) bool {
		if ev.Type == contract.EventBuildCompleted {
			done = platformtest.Payload[contract.BuildCompleted](t, ev)
		}
		return platformtest.TurnEnd(ev)
	})
	if end.Type != contract.EventTurnFailed {
		t.Errorf("the interrupted turn ended with %s %s", end.Type, end.Data)
	}
	if done.BuildID == "" {
		// The CLI may end the turn before the build's end is stored.
		stream.Until(30*time.Second, func(ev contract.Event) bool {
			if ev.Type == contract.EventBuildCompleted {
				done = platformtest.Payload[contract.BuildCompleted](t, ev)
				return true
			}
			return false
		})
	}
	if done.Phase != "cancelled" {
		t.Fatalf("build_completed %+v; want cancelled", done)
	}
	for _, proc := range processesIn(filepath.Join(p.SessionDir, "workspaces", conv)) {
		if strings.Contains(proc, "org.gradle") || strings.Contains(proc, "/bin/java ") {
			t.Errorf("a process of the cancelled build is left in its working tree: %s", proc)
		}
	}
	p.Send(conv, "please run `echo after-the-build`")
	if end := stream.Until(60*time.Second, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
		t.Errorf("turn after the interrupt: %s %s", end.Type, end.Data)
	}
}

// processesIn lists the processes whose working directory is dir or
// below ("<pid>: <command line>").
func processesIn(dir string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err == nil && (cwd == dir || strings.HasPrefix(cwd, dir+"/")) {
			cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	return out
}
