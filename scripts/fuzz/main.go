// Command fuzz runs every fuzz target of the repository (func FuzzXxx in a
// _test.go file) for a set time, one after the other, and prints how many
// executions each got and whether it found a failure (`make fuzz`,
// docs/testing.md "Fuzzing"). A failing input is kept where Go keeps it,
// testdata/fuzz/<target>/ beside the test, and runs with every `go test`
// from then on.
//
// It ends with one line:
//
//	fuzz targets=… failed=… fuzztime=… min_execs_per_s=… min_target=…
//
// and exits 1 when a target failed.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

type target struct{ name, dir string }

var fuzzFunc = regexp.MustCompile(`(?m)^func (Fuzz\w+)\(\w+ \*testing\.F\)`)

// execsLine is the fuzzer's progress line: "fuzz: elapsed: 10s, execs: 123 (12/sec), …".
var execsLine = regexp.MustCompile(`execs: (\d+) \(`)

func main() {
	fuzztime := flag.Duration("fuzztime", 10*time.Second, "how long each target runs")
	only := flag.String("run", "", "only the targets whose name matches this regular expression")
	minimize := flag.Duration("minimizetime", 0, "how long the fuzzer may shrink an input it keeps (go test -fuzzminimizetime); 0 keeps inputs whole, so a short run explores instead of shrinking")
	flag.Parse()
	var match *regexp.Regexp
	if *only != "" {
		var err error
		if match, err = regexp.Compile(*only); err != nil {
			fmt.Fprintln(os.Stderr, "fuzz: -run:", err)
			os.Exit(2)
		}
	}
	targets, err := find(".", match)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fuzz:", err)
		os.Exit(2)
	}
	if len(targets) == 0 {
		fmt.Fprintln(os.Stderr, "fuzz: no fuzz target found")
		os.Exit(2)
	}
	fmt.Printf("# %d fuzz targets, %s each (the first run of a package also compiles it)\n", len(targets), *fuzztime)
	fmt.Printf("%-28s %-36s %12s %10s  %s\n", "target", "package", "execs", "execs/s", "result")
	failed := 0
	minRate, minName := -1.0, ""
	for _, t := range targets {
		execs, out, err := run(t, *fuzztime, *minimize)
		if err != nil && stoppedLate(out) {
			// The fuzzer's workers did not stop within its own grace at
			// the end (a loaded machine): not a failure of the target.
			fmt.Printf("# %s: the fuzzer did not stop in time (%s); running it again\n", t.name, "context deadline exceeded")
			execs, out, err = run(t, *fuzztime, *minimize)
		}
		rate := float64(execs) / fuzztime.Seconds()
		result := "ok"
		if err != nil {
			failed++
			result = "FAIL: " + failure(out, err)
		}
		if minRate < 0 || rate < minRate {
			minRate, minName = rate, t.name
		}
		fmt.Printf("%-28s %-36s %12d %10.0f  %s\n", t.name, "./"+t.dir, execs, rate, result)
		if err != nil {
			fmt.Println(indent(out))
		}
	}
	fmt.Printf("fuzz targets=%d failed=%d fuzztime=%s min_execs_per_s=%.0f min_target=%s\n", len(targets), failed, *fuzztime, minRate, minName)
	if failed > 0 {
		os.Exit(1)
	}
}

// find lists the fuzz targets under root, by package directory and name.
func find(root string, match *regexp.Regexp) ([]target, error) {
	var out []target
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range fuzzFunc.FindAllSubmatch(b, -1) {
			if name := string(m[1]); match == nil || match.MatchString(name) {
				out = append(out, target{name: name, dir: filepath.Dir(path)})
			}
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].dir != out[j].dir {
			return out[i].dir < out[j].dir
		}
		return out[i].name < out[j].name
	})
	return out, err
}

// run fuzzes t for d and returns the executions the fuzzer reported last
// and its output.
// Shrinking a kept input (a new path or a failure) is limited to minimize:
// Go's default, 60 s, stalls a run of seconds at its first new path, as
// the executions spent shrinking are not counted.
func run(t target, d, minimize time.Duration) (int64, string, error) {
	cmd := exec.Command(goCommand(), "test", "-run", "^$", "-fuzz", "^"+t.name+"$", "-fuzztime", d.String(),
		"-fuzzminimizetime", minimize.String(), "./"+t.dir)
	out, err := cmd.CombinedOutput()
	var execs int64
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if m := execsLine.FindStringSubmatch(sc.Text()); m != nil {
			execs, _ = strconv.ParseInt(m[1], 10, 64)
		}
	}
	return execs, string(out), err
}

// stoppedLate reports whether out is a run that failed only because the
// fuzzer's workers did not stop in time: no failing input, "context
// deadline exceeded".
func stoppedLate(out string) bool {
	return strings.Contains(out, "context deadline exceeded") && !strings.Contains(out, "Failing input written to")
}

// failure is the line of out that says what failed, or err.
func failure(out string, err error) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "Failing input written to") {
			return strings.TrimSpace(l)
		}
	}
	return err.Error()
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}

// goCommand is the go command the fuzz runs use: $GO when set (the
// Makefile passes its GO), else "go".
func goCommand() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	return "go"
}
