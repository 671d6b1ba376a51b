// Tests of the repository as a whole: every package says what it is for,
// once, and the layout table (docs/architecture.md) says truly which binary
// links each package.
package talkide_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/talkide/talkide/internal/deptest"
)

const module = "github.com/talkide/talkide/"

// layoutFile holds the layout table, under "## Layout".
const layoutFile = "docs/architecture.md"

// TestEveryPackageHasOneDoc keeps the layout readable: each package (and
// command) of the module says what it is for in a package comment, in one
// file only, so that go doc shows one text and no two drift apart.
func TestEveryPackageHasOneDoc(t *testing.T) {
	for _, top := range []string{"internal", "cmd", "scripts"} {
		filepath.WalkDir(top, func(dir string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			if d.Name() == "testdata" || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			pkgs, err := parser.ParseDir(token.NewFileSet(), dir, func(fi os.FileInfo) bool {
				return !strings.HasSuffix(fi.Name(), "_test.go")
			}, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				t.Errorf("%s: %v", dir, err)
				return nil
			}
			for name, p := range pkgs {
				var docs []string
				for file, f := range p.Files {
					if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
						docs = append(docs, filepath.Base(file))
					}
				}
				slices.Sort(docs)
				switch len(docs) {
				case 0:
					t.Errorf("package %s (%s) has no package comment", name, dir)
				case 1:
				default:
					t.Errorf("package %s (%s) has %d package comments (%s); keep one, in doc.go or the main file", name, dir, len(docs), strings.Join(docs, ", "))
				}
			}
			return nil
		})
	}
}

// binaries are the module's binaries by the name the layout table gives
// them, in the order its "used by" column lists them.
var binaries = []struct{ name, pkg string }{
	{"control plane", "./cmd/talkide-controlplane"},
	{"worker", "./cmd/talkide-worker"},
	{"launcher", "./cmd/talkide"},
	{"dev upstream", "./cmd/talkide-devupstream"},
}

// TestLayoutTable checks the layout table: it names every package
// under internal/ and cmd/, and its "used by" column says which binaries
// link each one ("no binary" for tests and tools), as go list -deps does.
func TestLayoutTable(t *testing.T) {
	usedBy := map[string][]string{} // "internal/x" → binary names
	for _, b := range binaries {
		for _, p := range deptest.Deps(t, b.pkg) {
			if rel, ok := strings.CutPrefix(p.ImportPath, module); ok {
				usedBy[rel] = append(usedBy[rel], b.name)
			}
		}
	}
	readme, err := os.ReadFile(layoutFile)
	if err != nil {
		t.Fatal(err)
	}
	rows := layoutRows(t, string(readme))
	listed := map[string]bool{}
	code := regexp.MustCompile("`([^`]+)`")
	for _, r := range rows {
		for _, m := range code.FindAllStringSubmatch(r.paths, -1) {
			path := m[1]
			if !strings.HasPrefix(path, "internal/") && !strings.HasPrefix(path, "cmd/") {
				continue
			}
			listed[path] = true
			want := "no binary"
			if u := usedBy[path]; len(u) > 0 {
				want = strings.Join(u, ", ")
			}
			if r.usedBy != want {
				t.Errorf("layout table: %s is used by %q, want %q (go list -deps of each binary)", path, r.usedBy, want)
			}
		}
	}
	for _, p := range modulePackages(t) {
		if (strings.HasPrefix(p, "internal/") || strings.HasPrefix(p, "cmd/")) && !listed[p] {
			t.Errorf("layout table: package %s is missing; add a row saying what it is and which binary uses it", p)
		}
	}
}

// TestNestingRule: where a package lives says which side of the seam it
// is on (docs/architecture.md, "Layout"). One the worker links and the
// control plane does not lives under internal/worker/; one the control
// plane links and the worker does not, under internal/controlplane/; one
// both link, or neither (tests and tools), outside both.
func TestNestingRule(t *testing.T) {
	linked := func(cmd string) map[string]bool {
		m := map[string]bool{}
		for _, p := range deptest.Deps(t, cmd) {
			if rel, ok := strings.CutPrefix(p.ImportPath, module); ok {
				m[rel] = true
			}
		}
		return m
	}
	worker, cp := linked("./cmd/talkide-worker"), linked("./cmd/talkide-controlplane")
	under := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	for _, p := range modulePackages(t) {
		if !strings.HasPrefix(p, "internal/") {
			continue
		}
		inWorker, inCP := under(p, "internal/worker"), under(p, "internal/controlplane")
		switch {
		case worker[p] && !cp[p] && !inWorker:
			t.Errorf("%s is linked by the worker and not the control plane: move it under internal/worker/", p)
		case cp[p] && !worker[p] && !inCP:
			t.Errorf("%s is linked by the control plane and not the worker: move it under internal/controlplane/", p)
		case worker[p] == cp[p] && (inWorker || inCP):
			t.Errorf("%s is linked by both binaries or by neither: it belongs directly under internal/, not under %s", p, map[bool]string{true: "internal/worker/", false: "internal/controlplane/"}[inWorker])
		}
	}
}

type layoutRow struct{ paths, usedBy string }

// layoutRows reads the table under "## Layout": | path | used by | what |.
func layoutRows(t *testing.T, readme string) []layoutRow {
	_, section, ok := strings.Cut(readme, "\n## Layout\n")
	if !ok {
		t.Fatal(layoutFile + ` has no "## Layout" section`)
	}
	var rows []layoutRow
	inTable := false
	for line := range strings.Lines(section) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		inTable = true
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if len(cells) < 3 {
			t.Fatalf("layout table: row %q: want | path | used by | what |", line)
		}
		if cells[0] == "path" || strings.HasPrefix(cells[0], "---") {
			continue
		}
		rows = append(rows, layoutRow{paths: cells[0], usedBy: cells[1]})
	}
	if len(rows) == 0 {
		t.Fatal(layoutFile + ": no layout table under ## Layout")
	}
	return rows
}

// modulePackages lists the module's packages, relative to the module path.
func modulePackages(t *testing.T) []string {
	var out []string
	for _, top := range []string{"internal", "cmd"} {
		filepath.WalkDir(top, func(dir string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			if d.Name() == "testdata" || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			if goFiles, _ := filepath.Glob(filepath.Join(dir, "*.go")); len(goFiles) > 0 {
				out = append(out, filepath.ToSlash(dir))
			}
			return nil
		})
	}
	return out
}

// TestMakeHelpListsEveryTarget: `make help` prints the "## name: summary"
// lines of the Makefile, so every rule a user can name has one (the README
// says make help lists every target).
func TestMakeHelpListsEveryTarget(t *testing.T) {
	b, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	rules := regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):([^=]|$)`).FindAllStringSubmatch(string(b), -1)
	helped := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## ([a-z][a-z0-9-]*): \S`).FindAllStringSubmatch(string(b), -1) {
		helped[m[1]] = true
	}
	if len(rules) < 10 {
		t.Fatalf("found %d rules in the Makefile: the pattern no longer reads it", len(rules))
	}
	for _, r := range rules {
		if !helped[r[1]] {
			t.Errorf("make %s has no \"## %s: …\" line, so make help does not list it", r[1], r[1])
		}
	}
}
