package sandbox

import (
	"os"
	"testing"
)

// TestMain lets the test binary be the jail's helper (Jail.Helper), as the
// worker's binary is.
func TestMain(m *testing.M) {
	MaybeRunHelper()
	os.Exit(m.Run())
}
