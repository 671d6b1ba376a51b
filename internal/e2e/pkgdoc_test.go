package e2e

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryPackageHasADoc keeps the layout readable: each package (and
// command) of the module says what it is for in a package comment.
func TestEveryPackageHasADoc(t *testing.T) {
	root := filepath.Join("..", "..")
	for _, top := range []string{"internal", "cmd", "scripts"} {
		filepath.WalkDir(filepath.Join(root, top), func(dir string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() || d.Name() == "testdata" {
				return err
			}
			pkgs, err := parser.ParseDir(token.NewFileSet(), dir, func(fi os.FileInfo) bool {
				return !strings.HasSuffix(fi.Name(), "_test.go")
			}, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				t.Errorf("%s: %v", dir, err)
				return nil
			}
			for name, p := range pkgs {
				documented := false
				for _, f := range p.Files {
					if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
						documented = true
					}
				}
				if !documented {
					t.Errorf("package %s (%s) has no package comment", name, dir)
				}
			}
			return nil
		})
	}
}
