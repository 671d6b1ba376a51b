// Package deptest lets a binary's test say what the binary may not link, so
// that the seam between the control plane and the worker is a failing test
// rather than a convention: the worker never links what holds the API key
// or spends money, the control plane never links what runs agents.
//
// Main entries: Check fails a test for each forbidden package a binary links
// and prints the chain of imports that pulls it in; Deps lists what a
// package links (go list -deps, production files only). It is for tests; no
// binary links it. It does not judge third-party code beyond the import
// paths a test names.
package deptest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Package is what go list says about one package a binary links.
type Package struct {
	ImportPath string
	Imports    []string
	Standard   bool
}

// Deps returns every package that the package pkg (a pattern for go list,
// such as "." or "./cmd/talkide-worker", resolved from the test's working
// directory) links, itself included and last, in go list's dependency
// order. Test files are not counted: a binary does not link them.
func Deps(t testing.TB, pkg string) []Package {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Imports,Standard", pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.Bytes())
	}
	var pkgs []Package
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p Package
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list -deps %s: read output: %v", pkg, err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list -deps %s: no packages", pkg)
	}
	return pkgs
}

// Check fails t once for every package in bad (import path → why it may
// not be linked) that pkg links, naming the chain of imports that pulls it
// in. A path ending in "/..." forbids that package and everything under it.
func Check(t *testing.T, pkg string, bad map[string]string) {
	t.Helper()
	pkgs := Deps(t, pkg)
	root := pkgs[len(pkgs)-1].ImportPath
	byPath := make(map[string]Package, len(pkgs))
	for _, p := range pkgs {
		byPath[p.ImportPath] = p
	}
	patterns := make([]string, 0, len(bad))
	for b := range bad {
		patterns = append(patterns, b)
	}
	slices.Sort(patterns)
	for _, b := range patterns {
		// One failure per pattern, through the shortest chain: the other
		// packages under a "/..." pattern come along with the first.
		var first []string
		more := 0
		for _, p := range pkgs {
			if !matches(b, p.ImportPath) {
				continue
			}
			if c := chain(byPath, root, p.ImportPath); first == nil || len(c) < len(first) {
				first = c
			}
			more++
		}
		if first == nil {
			continue
		}
		also := ""
		if more > 1 {
			also = fmt.Sprintf(" (and %d more packages under %s)", more-1, b)
		}
		t.Errorf("%s links %s, which it may not: %s%s\n\timported through %s",
			root, first[len(first)-1], bad[b], also, strings.Join(first, " → "))
	}
}

// matches reports whether import path p is forbidden by pattern b.
func matches(b, p string) bool {
	if prefix, ok := strings.CutSuffix(b, "/..."); ok {
		return p == prefix || strings.HasPrefix(p, prefix+"/")
	}
	return p == b
}

// chain is a shortest chain of imports from root to target.
func chain(byPath map[string]Package, root, target string) []string {
	prev := map[string]string{root: ""}
	for queue := []string{root}; len(queue) > 0; queue = queue[1:] {
		cur := queue[0]
		if cur == target {
			var path []string
			for p := target; p != ""; p = prev[p] {
				path = append(path, p)
			}
			slices.Reverse(path)
			return path
		}
		for _, next := range byPath[cur].Imports {
			if _, seen := prev[next]; !seen {
				prev[next] = cur
				queue = append(queue, next)
			}
		}
	}
	return []string{root, "…", target}
}

// Only fails t once for every package under the import-path prefix within
// (such as the module's "github.com/talkide/talkide/") that pkg links and
// that allowed does not name. The binary itself is always allowed.
func Only(t *testing.T, pkg, within, why string, allowed ...string) {
	t.Helper()
	pkgs := Deps(t, pkg)
	root := pkgs[len(pkgs)-1].ImportPath
	byPath := make(map[string]Package, len(pkgs))
	for _, p := range pkgs {
		byPath[p.ImportPath] = p
	}
	for _, p := range pkgs {
		if p.ImportPath != root && strings.HasPrefix(p.ImportPath, within) && !slices.Contains(allowed, p.ImportPath) {
			t.Errorf("%s links %s, which it may not: %s\n\timported through %s",
				root, p.ImportPath, why, strings.Join(chain(byPath, root, p.ImportPath), " → "))
		}
	}
}
