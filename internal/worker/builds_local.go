package worker

import (
	"log/slog"

	"github.com/talkide/talkide/internal/buildjob"
	"github.com/talkide/talkide/internal/sandbox"
)

// newLocalRunner returns the runner of local builds: Gradle in the
// conversation's working tree, as its agent, in a jail of its own with the
// agents' limits when the worker jails its agents. The error says what to
// install when Gradle is missing.
func newLocalRunner(bc BuildConfig, workspaces string, jail *sandbox.Jail, log *slog.Logger) (buildjob.Runner, error) {
	r := &buildjob.LocalRunner{Gradle: bc.Gradle, WorkspaceRoot: workspaces, Jail: jail, MaxConcurrent: bc.MaxConcurrent, Timeout: bc.Timeout, Logger: log}
	if err := r.Check(); err != nil {
		return nil, err
	}
	return r, nil
}
