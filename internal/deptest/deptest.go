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
	"os"
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

// ImageBuild is the images' Go environment (internal/imagebuild's
// goBuildEnv, which a test there holds equal): no go env file, no GOFLAGS,
// no cgo, linux/amd64.
var ImageBuild = []string{
	"GOENV=off", "GOWORK=off", "GOFLAGS=",
	"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOAMD64=v1",
	"GOEXPERIMENT=", "GOFIPS140=off",
}

// Builds are the build settings Deps lists under, added to the test's
// environment: the host's as make build sees it (cgo on, as go build has
// it where a C compiler is) and the images' (ImageBuild), since a file
// with a build constraint may import something under one and not the
// other.
var Builds = [][]string{{"CGO_ENABLED=1"}, ImageBuild}

// Deps returns every package that the package pkg (a pattern for go list,
// such as "." or "./cmd/talkide-worker", resolved from the test's working
// directory) links under any of Builds, itself included and last, in go
// list's dependency order (the packages only another build links first).
// Test files are not counted: a binary does not link them.
func Deps(t testing.TB, pkg string) []Package {
	t.Helper()
	var all []Package
	for i := len(Builds) - 1; i >= 0; i-- {
		all = merge(all, depsUnder(t, pkg, Builds[i]))
	}
	return all
}

// merge returns b with the packages only a has put before it, and the
// imports of a package both list joined.
func merge(a, b []Package) []Package {
	inA := make(map[string]Package, len(a))
	for _, p := range a {
		inA[p.ImportPath] = p
	}
	var out []Package
	inB := make(map[string]bool, len(b))
	for _, p := range b {
		inB[p.ImportPath] = true
	}
	for _, p := range a {
		if !inB[p.ImportPath] {
			out = append(out, p)
		}
	}
	for _, p := range b {
		if q, ok := inA[p.ImportPath]; ok {
			for _, imp := range q.Imports {
				if !slices.Contains(p.Imports, imp) {
					p.Imports = append(p.Imports, imp)
				}
			}
		}
		out = append(out, p)
	}
	return out
}

// depsUnder is go list -deps of pkg with env added to the environment.
func depsUnder(t testing.TB, pkg string, env []string) []Package {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Imports,Standard", pkg)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s (%v): %v\n%s", pkg, env, err, stderr.Bytes())
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
