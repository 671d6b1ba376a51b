package harness

import (
	"os"
	"testing"

	"github.com/talkide/talkide/internal/worker/sandbox"
)

// TestMain lets the test binary be the jail's helper (Jail.Helper), as the
// worker's binary is.
func TestMain(m *testing.M) {
	sandbox.MaybeRunHelper()
	os.Exit(m.Run())
}
