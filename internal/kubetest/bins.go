package kubetest

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

//go:embed versions.env
var versionsFile string

// Versions are the pinned versions of the cluster's binaries (versions.env).
type Versions struct {
	Kubernetes string // kube-apiserver, -controller-manager, -scheduler, kubectl, kubelet, kube-proxy: "1.37.2"
	Etcd       string // "3.7.3"
	Kwok       string // "0.8.0"
	// The real node's runtime (NodeBinDir): "2.4.2", "1.5.3", "1.10.0", "1.15.0".
	Containerd, Runc, CNIPlugins, CoreDNS string
}

// Pinned returns the versions written in versions.env.
func Pinned() Versions {
	v, err := parseVersions(versionsFile)
	if err != nil {
		panic(err) // the embedded file is part of the source
	}
	return v
}

func parseVersions(s string) (Versions, error) {
	kv := map[string]string{}
	for line := range strings.Lines(s) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return Versions{}, fmt.Errorf("versions.env: bad line %q", line)
		}
		kv[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	v := Versions{Kubernetes: kv["K8S_VERSION"], Etcd: kv["ETCD_VERSION"], Kwok: kv["KWOK_VERSION"],
		Containerd: kv["CONTAINERD_VERSION"], Runc: kv["RUNC_VERSION"], CNIPlugins: kv["CNI_PLUGINS_VERSION"], CoreDNS: kv["COREDNS_VERSION"]}
	for name, val := range map[string]string{"K8S_VERSION": v.Kubernetes, "ETCD_VERSION": v.Etcd, "KWOK_VERSION": v.Kwok,
		"CONTAINERD_VERSION": v.Containerd, "RUNC_VERSION": v.Runc, "CNI_PLUGINS_VERSION": v.CNIPlugins, "COREDNS_VERSION": v.CoreDNS} {
		if val == "" {
			return Versions{}, fmt.Errorf("versions.env: %s is required", name)
		}
	}
	return v, nil
}

// Key names a set of binaries in the cache: a change of any version gives a
// new directory, so a stale set is never used.
func (v Versions) Key() string {
	return fmt.Sprintf("k8s-%s_etcd-%s_kwok-%s", v.Kubernetes, v.Etcd, v.Kwok)
}

// Binaries in a bin directory.
const (
	binEtcd       = "etcd"
	binAPIServer  = "kube-apiserver"
	binController = "kube-controller-manager"
	binScheduler  = "kube-scheduler"
	binKubectl    = "kubectl"
	binKwok       = "kwok"
	// stagesDir holds kwok's Stage manifests, copied from its module.
	stagesDir = "kwok-stages"
	stampFile = ".stamp"
)

// RepoRoot finds the module root (the directory holding go.mod) from the
// working directory upwards: tests run in their package directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find repository root: no go.mod above the working directory")
		}
		dir = parent
	}
}

// BinDir is where the binaries of v live: .cache/k8s/<key>/ in the
// repository (git-ignored). TALKIDE_K8S_BIN_DIR overrides it.
func BinDir(root string, v Versions) string {
	if d := os.Getenv("TALKIDE_K8S_BIN_DIR"); d != "" {
		return d
	}
	return filepath.Join(root, ".cache", "k8s", v.Key())
}

// stamped reports whether dir holds the complete set named key.
func stamped(dir, key string) bool {
	b, err := os.ReadFile(filepath.Join(dir, stampFile))
	return err == nil && string(b) == key+"\n"
}

// EnsureBuilt builds v's binaries into dir unless they are there already.
// A cold build compiles Kubernetes from the Go module proxy (minutes; see
// the README); with a warm Go build cache it takes seconds. Concurrent
// callers (test binaries of several packages) wait for one build through a
// file lock. Progress goes to log.
func EnsureBuilt(ctx context.Context, dir string, v Versions, log io.Writer) error {
	return ensureSet(dir, v.Key(), "test cluster binaries", "a cold build takes several minutes", log,
		func(out string) error { return build(ctx, out, v, log) })
}

// ensureSet builds the set of binaries named key into dir with build
// (into a temporary directory, renamed into place with its stamp once
// complete) unless it is there, one process at a time (a file lock).
func ensureSet(dir, key, what, how string, log io.Writer, build func(out string) error) error {
	if stamped(dir, key) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if stamped(dir, key) { // another process built it while we waited
		return nil
	}
	start := time.Now()
	fmt.Fprintf(log, "kubetest: building %s %s into %s (%s)\n", what, key, dir, how)
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := build(tmp); err != nil {
		return fmt.Errorf("build %s %s: %w", what, key, err)
	}
	if err := os.WriteFile(filepath.Join(tmp, stampFile), []byte(key+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	fmt.Fprintf(log, "kubetest: built %s in %s\n", key, time.Since(start).Round(time.Second))
	return nil
}

// build compiles every binary into out from throwaway modules in a
// temporary directory, with the go command the caller runs (niced).
func build(ctx context.Context, out string, v Versions, log io.Writer) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "kubetest-build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	g := goRunner{ctx: ctx, log: log}

	cmds := []string{binAPIServer, binController, binScheduler, binKubectl}
	if err := buildKubernetes(g, work, out, v, cmds); err != nil {
		return err
	}

	// etcd: `go install` refuses its server module (it has replace
	// directives), so a second throwaway module requires it and builds its
	// main package.
	edir := filepath.Join(work, "etcd")
	if err := writeModule(edir,
		fmt.Sprintf("module talkide.local/etcdbin\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 v%s\n", v.Etcd),
		"//go:build tools\n\npackage tools\n\nimport _ \"go.etcd.io/etcd/server/v3\"\n"); err != nil {
		return err
	}
	if err := g.run(edir, nil, "mod", "tidy"); err != nil {
		return err
	}
	if err := g.run(edir, nil, "build", "-ldflags", "-s -w", "-o", filepath.Join(out, binEtcd), "go.etcd.io/etcd/server/v3"); err != nil {
		return err
	}

	// kwok installs as is; its Stage manifests ship in its module zip.
	if err := g.run(work, []string{"GOBIN=" + out}, "install", "-ldflags", "-s -w", "sigs.k8s.io/kwok/cmd/kwok@v"+v.Kwok); err != nil {
		return err
	}
	kwokDir, err := g.downloadField("sigs.k8s.io/kwok@v"+v.Kwok, "Dir")
	if err != nil {
		return err
	}
	return copyTree(filepath.Join(kwokDir, "kustomize", "stage"), filepath.Join(out, stagesDir))
}

var stagingRE = regexp.MustCompile(`(?m)^\s*(k8s\.io/[a-z0-9-]+)\s+=>\s+\./staging/`)

// buildKubernetes builds the commands cmds of k8s.io/kubernetes at
// v.Kubernetes into out. The throwaway module is the same for every set
// (control plane, node), so a second set reuses the first one's build cache.
func buildKubernetes(g goRunner, work, out string, v Versions, cmds []string) error {
	// Kubernetes: its go.mod replaces the k8s.io/* staging modules with
	// ./staging paths missing from its module zip, so the throwaway module
	// maps each to the published v0.<minor>.<patch>.
	kmod, err := g.downloadField("k8s.io/kubernetes@v"+v.Kubernetes, "GoMod")
	if err != nil {
		return err
	}
	kgomod, err := os.ReadFile(kmod)
	if err != nil {
		return err
	}
	staging := "v0" + v.Kubernetes[strings.Index(v.Kubernetes, "."):]
	var mod strings.Builder
	fmt.Fprintf(&mod, "module talkide.local/kubebins\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes v%s\n\n", v.Kubernetes)
	for _, m := range stagingModules(kgomod) {
		fmt.Fprintf(&mod, "replace %s => %s %s\n", m, m, staging)
	}
	var tools strings.Builder
	tools.WriteString("//go:build tools\n\npackage tools\n\nimport (\n")
	for _, c := range cmds {
		fmt.Fprintf(&tools, "\t_ %q\n", "k8s.io/kubernetes/cmd/"+c)
	}
	tools.WriteString(")\n")
	kdir := filepath.Join(work, "kube")
	if err := writeModule(kdir, mod.String(), tools.String()); err != nil {
		return err
	}
	if err := g.run(kdir, nil, "mod", "tidy"); err != nil {
		return err
	}
	minor := strings.Split(v.Kubernetes, ".")[1]
	ld := strings.Join([]string{"-s -w",
		"-X k8s.io/component-base/version.gitVersion=v" + v.Kubernetes,
		"-X k8s.io/component-base/version.gitMajor=1",
		"-X k8s.io/component-base/version.gitMinor=" + minor,
		"-X k8s.io/component-base/version.gitTreeState=clean",
		"-X k8s.io/client-go/pkg/version.gitVersion=v" + v.Kubernetes,
	}, " ")
	for _, c := range cmds {
		if err := g.run(kdir, nil, "build", "-ldflags", ld, "-o", filepath.Join(out, c), "k8s.io/kubernetes/cmd/"+c); err != nil {
			return err
		}
	}
	return nil
}

// stagingModules lists the modules a k8s.io/kubernetes go.mod replaces with
// ./staging paths.
func stagingModules(gomod []byte) []string {
	var ms []string
	for _, m := range stagingRE.FindAllSubmatch(gomod, -1) {
		ms = append(ms, string(m[1]))
	}
	return ms
}

func writeModule(dir, gomod, tools string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tools.go"), []byte(tools), 0o644)
}

// goRunner runs the go command under nice (the builds are long and the
// machines shared), logging each step and its duration.
type goRunner struct {
	ctx context.Context
	log io.Writer
}

func (g goRunner) command(dir string, env []string, args ...string) *exec.Cmd {
	name, full := "go", args
	if nice, err := exec.LookPath("nice"); err == nil {
		name, full = nice, append([]string{"-n", "10", "go"}, args...)
	}
	cmd := exec.CommandContext(g.ctx, name, full...)
	cmd.Dir = dir
	// -mod=mod lets the throwaway modules record what tidy resolved; the
	// caller's GOFLAGS (e.g. -mod=vendor) must not leak in.
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

func (g goRunner) run(dir string, env []string, args ...string) error {
	start := time.Now()
	cmd := g.command(dir, env, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	fmt.Fprintf(g.log, "kubetest: go %s\n", strings.Join(args, " "))
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, tail(out.String(), 40))
	}
	fmt.Fprintf(g.log, "kubetest:   done in %s\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// downloadField runs `go mod download -json mod` and returns one field
// (GoMod, Dir) of its answer.
func (g goRunner) downloadField(mod, field string) (string, error) {
	cmd := g.command(os.TempDir(), nil, "mod", "download", "-json", mod)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", mod, err)
	}
	var info map[string]any
	if err := json.Unmarshal(out, &info); err != nil {
		return "", fmt.Errorf("go mod download %s: %w", mod, err)
	}
	s, _ := info[field].(string)
	if s == "" {
		return "", fmt.Errorf("go mod download %s: no %s in %s", mod, field, out)
	}
	return s, nil
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
