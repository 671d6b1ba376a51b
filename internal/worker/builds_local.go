package worker

import (
	"log/slog"

	"github.com/talkide/talkide/internal/worker/buildjob"
	"github.com/talkide/talkide/internal/worker/sandbox"
)

// newLocalRunner returns the runner of local builds: Gradle in the
// conversation's working tree, as its agent, in a jail of its own with the
// agents' limits when the worker jails its agents. A build is held to the
// agents' disk limit, jail or not (diskLimit: TALKIDE_AGENT_DISK, 0 for
// none): its Gradle home is outside the conversation's directories. The
// error says what to install when Gradle is missing.
func newLocalRunner(bc BuildConfig, workspaces string, jail *sandbox.Jail, diskLimit int64, log *slog.Logger) (buildjob.Runner, error) {
	if diskLimit <= 0 {
		diskLimit = -1 // no limit, even if a jail had one
	}
	r := &buildjob.LocalRunner{Gradle: bc.Gradle, WorkspaceRoot: workspaces, Jail: jail, DiskLimit: diskLimit,
		MaxConcurrent: bc.MaxConcurrent, Timeout: bc.Timeout, Logger: log}
	if err := r.Check(); err != nil {
		return nil, err
	}
	return r, nil
}
