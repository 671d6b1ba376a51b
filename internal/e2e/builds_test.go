package e2e

import (
	"net/http"
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
	if end := stream.Until(5*time.Minute, platformtest.TurnEnd); end.Type != contract.EventTurnCompleted {
		t.Fatalf("build turn ended with %s: %s", end.Type, end.Data)
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
