package worker

import (
	"errors"
	"log/slog"

	"github.com/talkide/talkide/internal/buildjob"
	"github.com/talkide/talkide/internal/sandbox"
)

// newLocalRunner returns the runner of local builds.
func newLocalRunner(bc BuildConfig, workspaces string, jail *sandbox.Jail, log *slog.Logger) (buildjob.Runner, error) {
	return nil, errors.New("local builds: not wired yet")
}
