package imagebuild

import (
	"slices"
	"testing"

	"github.com/talkide/talkide/internal/deptest"
)

// TestDepTestListsUnderTheImagesBuild: the binaries' dependency tests
// (cmd/*/deps_test.go) judge what ships only if they list under the Go
// environment the images are built with.
func TestDepTestListsUnderTheImagesBuild(t *testing.T) {
	if !slices.Equal(deptest.ImageBuild, goBuildEnv) {
		t.Errorf("deptest.ImageBuild = %q, goBuildEnv = %q: keep them equal", deptest.ImageBuild, goBuildEnv)
	}
}
