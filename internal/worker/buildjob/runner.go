package buildjob

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Spec is what a build runs, as the agent asked for it: Gradle tasks and
// an optional test filter. Both are plain names (validated by the
// runners): never options, so a request cannot add an init script or a
// property.
type Spec struct {
	// Tasks are the Gradle tasks, e.g. ["test"] or ["build"].
	Tasks []string `json:"tasks"`
	// Tests filters the test task (`--tests`), e.g. "com.acme.FooTest";
	// empty: every test.
	Tests string `json:"tests,omitempty"`
}

// Hooks receive what a running build reports. Either may be nil. They are
// called from the runner's goroutines, never concurrently with themselves.
type Hooks struct {
	// Progress gets the build's state changes (queued with a place,
	// started, the pod's phase).
	Progress func(Progress)
	// Line gets each line of the build's log, without its newline, cut at
	// MaxLogLine bytes.
	Line func(string)
	// Detach, when closed, makes Run return at once with PhaseDetached and
	// leave the build running (the worker is stopping: a build Job goes on,
	// and the restarted worker follows it again). A local build cannot
	// outlive its worker and ignores it.
	Detach <-chan struct{}
}

// Report is a finished build as the agent and the browser see it.
type Report struct {
	// Runner names where it ran: "kubernetes" (a Job) or "local".
	Runner  string  `json:"runner"`
	Outcome Outcome `json:"outcome"`
	// ExitCode is the build command's exit status; -1 when it is not known
	// (cancelled, never started, a pod whose status was lost).
	ExitCode int `json:"exit_code"`
	// Results are the JUnit reports found in the working tree after the
	// build (none for a build that runs no tests); Skipped names reports
	// that could not be read, with why.
	Results Results  `json:"results"`
	Skipped []string `json:"skipped_reports,omitempty"`
	// LogTail is the last lines of the log (at most LogTailLines).
	LogTail []string `json:"log_tail"`
	// DurationMS is the build's wall time in milliseconds, queue included.
	DurationMS int64 `json:"duration_ms"`
}

// LogTailLines is how many of a build's last log lines a Report keeps.
const LogTailLines = 40

// Runner runs one build of a conversation's working tree to its end: a
// Kubernetes Job (KubeRunner) or a contained process on the worker's
// machine (LocalRunner). Same request, same report.
type Runner interface {
	// Run runs spec for req and returns its report. When ctx ends first
	// (the turn interrupted, the conversation deleted) the build is
	// stopped and the outcome is PhaseCancelled. An error means the build
	// could not be run or followed at all (a refused request, the API
	// unreachable); a build that ran and failed is a report, not an error.
	Run(ctx context.Context, req Request, spec Spec, hooks Hooks) (Report, error)
}

// tail keeps the last n lines given to it. Safe for concurrent use.
type tail struct {
	mu    sync.Mutex
	n     int
	lines []string
}

func newTail(n int) *tail { return &tail{n: n} }

func (t *tail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == t.n {
		copy(t.lines, t.lines[1:])
		t.lines = t.lines[:t.n-1]
	}
	t.lines = append(t.lines, line)
}

func (t *tail) get() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string{}, t.lines...)
}

func (h Hooks) progress(p Progress) {
	if h.Progress != nil {
		h.Progress(p)
	}
}

func (h Hooks) line(s string) {
	if h.Line != nil {
		h.Line(s)
	}
}

func since(t time.Time) int64 { return time.Since(t).Milliseconds() }

// ValidateSpec checks that spec names at least one task, that each task is
// a task name and the filter a class or method pattern: never an option.
func ValidateSpec(spec Spec) error {
	var errs []error
	if len(spec.Tasks) == 0 {
		errs = append(errs, errors.New("gradle: no task"))
	}
	if len(spec.Tasks) > 16 {
		errs = append(errs, fmt.Errorf("gradle: %d tasks, at most 16", len(spec.Tasks)))
	}
	for _, t := range spec.Tasks {
		if !gradleTask.MatchString(t) {
			errs = append(errs, fmt.Errorf("gradle task %q: want a task name", t))
		}
	}
	if spec.Tests != "" && !gradleFilter.MatchString(spec.Tests) {
		errs = append(errs, fmt.Errorf("gradle test filter %q: want a class or method pattern", spec.Tests))
	}
	return errors.Join(errs...)
}
