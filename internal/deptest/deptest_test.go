package deptest

import (
	"slices"
	"testing"
)

// TestDepsUnderEveryBuild: a package imported only under the images'
// build settings (no cgo) counts as linked, as does one imported only on
// the host (cgo), and the root stays last.
func TestDepsUnderEveryBuild(t *testing.T) {
	pkgs := Deps(t, "./testdata/twobuilds")
	var paths []string
	for _, p := range pkgs {
		paths = append(paths, p.ImportPath)
	}
	for _, want := range []string{"net/http/cookiejar", "net/http/httptrace"} {
		if !slices.Contains(paths, want) {
			t.Errorf("Deps: %s missing from %v", want, paths)
		}
	}
	root := pkgs[len(pkgs)-1]
	if root.ImportPath != "github.com/talkide/talkide/internal/deptest/testdata/twobuilds" ||
		!slices.Contains(root.Imports, "net/http/cookiejar") || !slices.Contains(root.Imports, "net/http/httptrace") {
		t.Errorf("root %+v: want the package last with the imports of both builds", root)
	}
}

// TestDepsIgnoreTheTestsGOFLAGS: a file that ships in the images is
// listed even when the tests run with GOFLAGS that exclude it.
func TestDepsIgnoreTheTestsGOFLAGS(t *testing.T) {
	t.Setenv("GOFLAGS", "-tags=localdev")
	var paths []string
	for _, p := range Deps(t, "./testdata/tagged") {
		paths = append(paths, p.ImportPath)
	}
	if !slices.Contains(paths, "net/http/cookiejar") {
		t.Errorf("Deps: net/http/cookiejar missing from %v", paths)
	}
}
