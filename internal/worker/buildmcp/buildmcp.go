// Package buildmcp is the talkide-build MCP server the worker offers to
// every Claude Code session: its tool run_build (the CLI names it
// mcp__talkide-build__run_build) builds and tests the conversation's
// working tree with Gradle outside the agent's jail, in a Kubernetes Job
// (buildjob.KubeRunner) or, on one machine, a contained local process
// (buildjob.LocalRunner), and returns what the agent can act on: the
// outcome, the exit status, every failed test with its message, and the
// log's tail.
//
// The conversation's event stream follows the build: build_started,
// build_progress (queue place, pod phase, log lines in batches) and
// build_completed (contract.BuildCompleted). A build is recorded in the
// SessionStore (sessionstore.BuildRecord) before it starts and the record
// removed once its build_completed is stored, and then its build Job
// deleted (Releaser); Recover, run at worker start
// and then periodically, delivers the result of every recorded build no
// live tool call follows (a worker restarted mid-build) and deletes the
// build Jobs nothing records. An interrupted turn or a deleted conversation
// cancels its builds (the Job deleted with its pod).
//
// Main types: Server and Config. It is reached over the CLI's control
// protocol through package mcphost.
package buildmcp

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/buildjob"
	"github.com/talkide/talkide/internal/worker/mcphost"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// ServerName is the MCP server's name; the CLI prefixes its tools with
// mcp__talkide-build__.
const ServerName = "talkide-build"

// ToolName is the build tool's full name as the CLI calls it.
const ToolName = "mcp__" + ServerName + "__run_build"

// Records stores the builds conversations wait for (the SessionStore).
type Records interface {
	PutBuild(sessionstore.BuildRecord) error
	RemoveBuild(conv, id string) error
	HasBuild(conv, id string) (bool, error)
	ListBuilds() ([]sessionstore.BuildRecord, []string, error)
}

var _ Records = (*sessionstore.Store)(nil)

// Config configures a Server.
type Config struct {
	// Runner runs builds; nil offers the tool anyway, and it answers with
	// Unavailable, so the agent learns why it cannot build.
	Runner buildjob.Runner
	// RunnerName is "kubernetes" or "local" (buildjob.Runner*).
	RunnerName string
	// Unavailable says why builds cannot run here (with what to install or
	// configure), when Runner is nil.
	Unavailable string
	// Tenant and Env name the worker's tenant-env (build Jobs' labels and
	// namespace).
	Tenant, Env string
	Records     Records
	Logger      *slog.Logger
	// FlushEvery is the longest a log line waits before it is sent in a
	// build_progress event. Default 1 s.
	FlushEvery time.Duration
}

// Server makes the build tool's MCP server of each CLI process, and
// follows recorded builds after a restart (Recover). Safe for concurrent
// use.
type Server struct {
	cfg Config

	mu sync.Mutex
	// live are the builds a tool call of this worker follows, by
	// conversation and build id; guarded by mu.
	live map[liveKey]context.CancelFunc
	// detach is closed by Detach; detached guards it; guarded by mu.
	detach   chan struct{}
	detached bool
	// warned are the unreadable records logged already; guarded by mu.
	warned map[string]bool
}

// Runner says where builds run ("kubernetes" or "local"), or, when they
// cannot run here, "" and why (Config.Unavailable).
func (s *Server) Runner() (name, unavailable string) {
	if s.cfg.Runner == nil {
		return "", s.cfg.Unavailable
	}
	return s.cfg.RunnerName, ""
}

// Detach makes every build this worker follows go on without it: call it
// when the worker stops, before its CLI processes end. Their build Jobs
// keep running, their records stay, and the restarted worker delivers
// their results (Recover). Builds started after it are refused.
func (s *Server) Detach() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.detached {
		s.detached = true
		close(s.detach)
	}
}

// buildContext is the context a build runs under for a follower whose
// context is ctx: it ends (stopping the build) when ctx does, unless the
// server was detached first (the worker is stopping: the build goes on).
func (s *Server) buildContext(ctx context.Context) (context.Context, context.CancelFunc) {
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		select {
		case <-ctx.Done():
			select {
			case <-s.detach:
			default:
				cancel()
			}
		case <-bctx.Done():
		}
	}()
	return bctx, cancel
}

type liveKey struct{ conv, id string }

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = time.Second
	}
	return &Server{cfg: cfg, live: map[liveKey]context.CancelFunc{}, detach: make(chan struct{}), warned: map[string]bool{}}
}

// Conversation is the CLI process a session of the server is for.
type Conversation struct {
	ID string
	// UID is the agent's uid: the build runs as it and its reports must
	// be its files.
	UID int64
	// Emit appends an event to the conversation's event log.
	Emit func(contract.EventType, any)
}

// Open starts a session of the server for one CLI process of c. Close it
// when the process ends.
func (s *Server) Open(c Conversation) (*mcphost.Handler, error) {
	srv := mcp.NewServer(&mcp.Implementation{Name: ServerName, Title: "TalkIDE builds", Version: "1"}, &mcp.ServerOptions{
		Instructions: "Builds and tests this project with Gradle outside your sandbox, and returns the failed tests with their messages. " +
			"Use run_build to run the tests instead of running gradle yourself.",
		Logger: s.cfg.Logger,
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "run_build", Title: "Run build",
		Description: "Run Gradle tasks on the project in the working directory (default: test) in a separate build environment, offline, " +
			"and wait for the result: outcome, exit code, every failed test with its message and stack trace start, and the log's last lines. " +
			"Use `tests` to run only some tests (a class or method pattern, as gradle --tests). The user sees the build's progress."},
		func(ctx context.Context, req *mcp.CallToolRequest, in runInput) (*mcp.CallToolResult, any, error) {
			return s.run(ctx, c, toolUseID(req), in), nil, nil
		})
	return mcphost.Open(srv)
}

type runInput struct {
	Tasks []string `json:"tasks,omitempty" jsonschema:"Gradle task names, e.g. [\"test\"] or [\"build\"] (default [\"test\"])"`
	Tests string   `json:"tests,omitempty" jsonschema:"only tests matching this pattern, e.g. com.acme.CalculatorTest or *Calculator*"`
}

var buildID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// toolUseID is the tool call's id, which Claude Code passes in the call's
// _meta ("claudecode/toolUseId", checked with 2.1.332): the build's id, so
// the browser ties the build to its tool call, and a repeated call is the
// same build.
func toolUseID(req *mcp.CallToolRequest) string {
	if req != nil && req.Params != nil {
		if id, ok := req.Params.GetMeta()["claudecode/toolUseId"].(string); ok && buildID.MatchString(id) {
			return id
		}
	}
	return "build-" + uuid.NewString()
}

func text(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}

func toolError(format string, args ...any) *mcp.CallToolResult {
	r := text(format, args...)
	r.IsError = true
	return r
}

// run runs one build for a tool call.
func (s *Server) run(ctx context.Context, c Conversation, id string, in runInput) *mcp.CallToolResult {
	if s.cfg.Runner == nil {
		return toolError("Builds are not available on this worker: %s", s.cfg.Unavailable)
	}
	spec := buildjob.Spec{Tasks: in.Tasks, Tests: in.Tests}
	if len(spec.Tasks) == 0 {
		spec.Tasks = []string{"test"}
	}
	if err := buildjob.ValidateSpec(spec); err != nil {
		return toolError("Invalid arguments: %v.", err)
	}
	rec := sessionstore.BuildRecord{Conversation: c.ID, ID: id, Runner: s.cfg.RunnerName, Tasks: spec.Tasks, Tests: spec.Tests, UID: c.UID, Started: time.Now().UTC()}
	ctx, cancel := s.buildContext(ctx)
	defer cancel()
	key := liveKey{c.ID, id}
	s.mu.Lock()
	if s.detached {
		s.mu.Unlock()
		return toolError("The worker is restarting; no build can start now. Try again in a minute.")
	}
	if _, dup := s.live[key]; dup {
		s.mu.Unlock()
		return toolError("This build is already running.")
	}
	s.live[key] = cancel
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.live, key)
		s.mu.Unlock()
	}()
	if err := s.cfg.Records.PutBuild(rec); err != nil {
		s.cfg.Logger.Error("record build", "conversation", c.ID, "build", id, "err", err)
		return toolError("The build could not be recorded (the worker's storage refused it), so it was not started. Try again later.")
	}
	c.Emit(contract.EventBuildStarted, contract.BuildStarted{BuildID: id, Runner: s.cfg.RunnerName, Tasks: spec.Tasks, Tests: spec.Tests})
	emit := func(t contract.EventType, p any) error { c.Emit(t, p); return nil }
	req := buildjob.Request{Tenant: s.cfg.Tenant, Env: s.cfg.Env, Conversation: c.ID, ID: id, RunAsUser: c.UID}
	ev := newEmitter(id, emit, s.cfg.FlushEvery)
	rep, err := s.cfg.Runner.Run(ctx, req, spec, buildjob.Hooks{Progress: ev.progress, Line: ev.line, Detach: s.detach})
	ev.close()
	if rep.Outcome.Phase == buildjob.PhaseDetached {
		s.cfg.Logger.Info("build left running while the worker stops", "conversation", c.ID, "build", id)
		return toolError("The worker is restarting. The build goes on; its result will appear in the conversation as a build_completed event.")
	}
	return toolResult(s.deliver(rec, rep, err, emit, false))
}

// deliver emits the build_completed of rec's build (which ended as rep, or
// could not run: err) and, once it is stored, removes the build's record.
func (s *Server) deliver(rec sessionstore.BuildRecord, rep buildjob.Report, err error, emit func(contract.EventType, any) error, recovered bool) contract.BuildCompleted {
	done := completed(rec.ID, s.cfg.RunnerName, rep, recovered)
	if err != nil {
		s.cfg.Logger.Error("build could not run", "conversation", rec.Conversation, "build", rec.ID, "err", err)
		done.Phase, done.Reason, done.Message = buildjob.PhaseFailed, "NotRun", err.Error()
	}
	s.cfg.Logger.Info("build ended", "conversation", rec.Conversation, "build", rec.ID, "runner", s.cfg.RunnerName, "phase", done.Phase, "reason", done.Reason,
		"exit_code", done.ExitCode, "tests", done.Tests, "failures", done.Failures+done.Errors, "duration_ms", done.DurationMS, "recovered", recovered)
	if err := emit(contract.EventBuildCompleted, done); err != nil {
		s.cfg.Logger.Warn("build result not delivered; kept for the next pass", "conversation", rec.Conversation, "build", rec.ID, "err", err)
		return done
	}
	if err := s.cfg.Records.RemoveBuild(rec.Conversation, rec.ID); err != nil {
		s.cfg.Logger.Error("remove build record", "conversation", rec.Conversation, "build", rec.ID, "err", err)
		return done // kept: the next pass delivers it again, from its Job
	}
	// Delivered and forgotten: the build's Job goes now, not at the next
	// pass (a finished Job holds the namespace's Job quota). Not when the
	// build could not run or be followed (err): what has its name may not
	// be its Job, and the next pass deletes it if it is.
	if r, ok := s.cfg.Runner.(Releaser); ok && err == nil && (rep.Outcome.Phase == buildjob.PhaseSucceeded || rep.Outcome.Phase == buildjob.PhaseFailed) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req := buildjob.Request{Tenant: s.cfg.Tenant, Env: s.cfg.Env, Conversation: rec.Conversation, ID: rec.ID, RunAsUser: rec.UID}
		if err := r.Release(ctx, req); err != nil {
			s.cfg.Logger.Warn("delete a delivered build's Job; the next pass does", "conversation", rec.Conversation, "build", rec.ID, "err", err)
		}
	}
	return done
}

// Releaser is a Runner whose builds leave something behind until their
// result is delivered: buildjob.KubeRunner, the finished Job (which a
// worker restarted before the delivery follows again). deliver releases a
// build once its build_completed is stored and its record removed.
type Releaser interface {
	Release(ctx context.Context, req buildjob.Request) error
}

var _ Releaser = (*buildjob.KubeRunner)(nil)

// maxFailedShown bounds the failed tests an event and a tool result carry.
const maxFailedShown = 50

func completed(id, runner string, rep buildjob.Report, recovered bool) contract.BuildCompleted {
	out := contract.BuildCompleted{BuildID: id, Runner: runner, Phase: rep.Outcome.Phase, Reason: rep.Outcome.Reason, Message: rep.Outcome.Message,
		ExitCode: rep.ExitCode, Tests: rep.Results.Tests, Failures: rep.Results.Failures, Errors: rep.Results.Errors, Skipped: rep.Results.Skipped,
		DurationMS: rep.DurationMS, Recovered: recovered}
	for _, l := range rep.LogTail {
		out.LogTail = append(out.LogTail, clip(l, maxEventText/2))
	}
	for _, n := range rep.Results.Truncated {
		out.ReportsTruncated = append(out.ReportsTruncated, clip(n, maxEventText/4))
	}
	for i, f := range rep.Results.Failed() {
		if i == maxFailedShown {
			break
		}
		out.Failed = append(out.Failed, contract.BuildTestFailure{Class: f.Class, Name: f.Name, Status: f.Status, Type: f.Type,
			Message: clip(f.Message, maxEventText/2), Detail: clipTrace(f.Detail, maxEventText)})
	}
	return out
}

// Bounds of what a build's result carries: a failure's trace (half as
// much for its message and a log tail line) in build_completed, which so
// stays under 100 KiB; the tool result in all, a failure's message and a
// log line in it (the CLI cuts a tool result of more than about 25,000
// characters from the middle, and the model then misses the failures).
const (
	maxEventText    = 1 << 10
	maxResultBytes  = 20000
	maxResultText   = 500
	maxResultLogTxt = 3000
)

// toolResult is what the agent reads: a summary first, then each failed
// test with its message and the start of its trace, then the log's tail.
func toolResult(d contract.BuildCompleted) *mcp.CallToolResult {
	var b strings.Builder
	switch d.Phase {
	case buildjob.PhaseSucceeded:
		fmt.Fprintf(&b, "BUILD SUCCEEDED (exit code %d, %.1f s).", d.ExitCode, float64(d.DurationMS)/1000)
		if d.Failures+d.Errors > 0 {
			b.WriteString(" But its test reports hold failures (the build ignores them).")
		}
	case buildjob.PhaseCancelled:
		fmt.Fprintf(&b, "BUILD CANCELLED: %s.", nonEmpty(d.Message, "the turn was interrupted"))
	default:
		fmt.Fprintf(&b, "BUILD FAILED (%s, exit code %d, %.1f s)", d.Reason, d.ExitCode, float64(d.DurationMS)/1000)
		if d.Message != "" {
			fmt.Fprintf(&b, ": %s", d.Message)
		}
		b.WriteString(".")
	}
	if d.Tests > 0 {
		fmt.Fprintf(&b, "\nTests: %d run, %d failed, %d errors, %d skipped.", d.Tests, d.Failures, d.Errors, d.Skipped)
	} else if d.Phase != buildjob.PhaseCancelled {
		b.WriteString("\nNo test reports were found (build/test-results).")
	}
	if len(d.ReportsTruncated) > 0 {
		fmt.Fprintf(&b, "\nThe test reports were not read whole: %s.", clip(strings.Join(d.ReportsTruncated, "; "), 1000))
	}
	// The log's tail, kept within its budget, goes last; the failures
	// take what is left, and those beyond it are named only.
	tail := logTail(d.LogTail)
	for i, f := range d.Failed {
		msg := f.Message
		frames := ""
		if f.Detail != "" {
			first, rest, _ := strings.Cut(strings.TrimSpace(f.Detail), "\n")
			if msg == "" {
				msg = first
			}
			frames = projectFrames(rest, f.Class)
		}
		entry := fmt.Sprintf("\n\n%s %s.%s", strings.ToUpper(f.Status), f.Class, f.Name)
		if msg != "" {
			entry += ": " + clip(msg, maxResultText)
		}
		if frames != "" {
			entry += "\n" + frames
		}
		if b.Len()+len(entry)+len(tail) > maxResultBytes-500 {
			names := make([]string, 0, len(d.Failed)-i)
			for _, g := range d.Failed[i:] {
				names = append(names, g.Class+"."+g.Name)
			}
			fmt.Fprintf(&b, "\n\n%d more failed: %s", len(names), clip(strings.Join(names, ", "), 400))
			break
		}
		b.WriteString(entry)
	}
	if n := d.Failures + d.Errors - len(d.Failed); n > 0 {
		fmt.Fprintf(&b, "\n\n(%d more failures are in the reports, build/test-results.)", n)
	}
	b.WriteString(tail)
	r := text("%s", b.String())
	r.IsError = d.Phase != buildjob.PhaseSucceeded
	return r
}

// projectFrames are the frames of a stack trace (without its first
// line) the agent needs: those in the test's package, the project's own
// code, and "Caused by" lines, at most 6; the test framework's and the
// JVM's frames are left out. A trace with no such frame keeps its first 6
// lines.
func projectFrames(frames, class string) string {
	if frames == "" {
		return ""
	}
	lines := strings.Split(frames, "\n")
	pkg := class
	if i := strings.LastIndex(class, "."); i > 0 {
		pkg = class[:i+1]
	}
	var out []string
	for _, l := range lines {
		if len(out) == 6 {
			break
		}
		if frame := strings.TrimSpace(l); strings.HasPrefix(frame, "at "+pkg) || strings.HasPrefix(frame, "Caused by:") {
			out = append(out, clip(l, maxResultText))
		}
	}
	if len(out) == 0 {
		for _, l := range lines[:min(len(lines), 6)] {
			out = append(out, clip(l, maxResultText))
		}
	}
	return strings.Join(out, "\n")
}

// logTail is the tool result's part of the log's tail: its last lines,
// each cut, within maxResultLogTxt.
func logTail(lines []string) string {
	var kept []string
	size := 0
	for i := len(lines) - 1; i >= 0; i-- {
		l := clip(lines[i], maxResultText)
		if size+len(l)+1 > maxResultLogTxt {
			break
		}
		kept = append([]string{l}, kept...)
		size += len(l) + 1
	}
	if len(kept) == 0 {
		return ""
	}
	return fmt.Sprintf("\n\nLast %d lines of the build log:\n%s", len(kept), strings.Join(kept, "\n"))
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// CancelConversation cancels the builds of conv this worker follows (the
// conversation is being deleted): each Job is deleted with its pod.
func (s *Server) CancelConversation(conv string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, cancel := range s.live {
		if k.conv == conv {
			cancel()
		}
	}
}

// clip cuts s to at most n bytes on a UTF-8 boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// clipTrace cuts a stack trace to n bytes, its first line (the exception
// and its message, which may be long) to half of that: the frames after
// it say where the test failed.
func clipTrace(trace string, n int) string {
	first, rest, ok := strings.Cut(trace, "\n")
	if !ok {
		return clip(trace, n)
	}
	first = clip(first, n/2)
	return clip(first+"\n"+rest, n)
}
