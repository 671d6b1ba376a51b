package kubetest

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The real node's binaries (StartNode), in NodeBinDir.
const (
	binKubelet    = "kubelet"
	binKubeProxy  = "kube-proxy"
	binContainerd = "containerd"
	binCtr        = "ctr"
	binShim       = "containerd-shim-runc-v2"
	binRunc       = "runc"
	binCoreDNS    = "coredns"
	// cniDir holds the CNI plugins.
	cniDir = "cni"
	// pauseImage is the sandbox image, an archive `ctr images import` takes.
	pauseImage = "pause.tar"
)

// cniPlugins are the CNI plugins the node's network uses (containerd adds
// loopback itself).
var cniPlugins = []string{"main/bridge", "ipam/host-local", "main/loopback", "meta/portmap"}

// PauseImageRef is the sandbox image of the real node's pods, built from
// Kubernetes' own pause.c (no registry is reachable).
const PauseImageRef = "registry.k8s.io/pause:3.10.2"

// NodeKey names the real node's set of binaries in the cache.
func (v Versions) NodeKey() string {
	return fmt.Sprintf("node-k8s-%s_containerd-%s_runc-%s_cni-%s_coredns-%s", v.Kubernetes, v.Containerd, v.Runc, v.CNIPlugins, v.CoreDNS)
}

// NodeBinDir is where the real node's binaries of v live:
// .cache/k8s/<NodeKey>/ in the repository (git-ignored).
// TALKIDE_K8S_NODE_BIN_DIR overrides it.
func NodeBinDir(root string, v Versions) string {
	if d := os.Getenv("TALKIDE_K8S_NODE_BIN_DIR"); d != "" {
		return d
	}
	return filepath.Join(root, ".cache", "k8s", v.NodeKey())
}

// NodeBuilt reports whether dir holds a complete set of v's node binaries.
func NodeBuilt(dir string, v Versions) bool { return stamped(dir, v.NodeKey()) }

// nodeBuildMissing names what this machine lacks to build the node's
// binaries: gcc, libseccomp's headers (runc) and a static libc (the pause
// image). `make node-tools` installs them.
func nodeBuildMissing() []string {
	var miss []string
	if _, err := exec.LookPath("gcc"); err != nil {
		miss = append(miss, "gcc (Debian package gcc)")
	}
	if _, err := os.Stat("/usr/include/seccomp.h"); err != nil {
		miss = append(miss, "libseccomp's headers (Debian package libseccomp-dev), for runc")
	}
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/libc.a"); err != nil {
		miss = append(miss, "a static libc (Debian package libc6-dev), for the pause image")
	}
	return miss
}

// EnsureNodeBuilt builds v's node binaries into dir unless they are there:
// kubelet and kube-proxy from k8s.io/kubernetes (in the same throwaway
// module as EnsureBuilt's, so a warm build cache makes them quick),
// containerd, ctr and its runc shim, runc (with cgo and libseccomp), the
// CNI plugins, CoreDNS with only the plugins the node uses, and the pause
// image. Progress goes to log; concurrent callers wait for one build.
func EnsureNodeBuilt(ctx context.Context, dir string, v Versions, log io.Writer) error {
	if NodeBuilt(dir, v) {
		return nil
	}
	if miss := nodeBuildMissing(); len(miss) > 0 {
		return fmt.Errorf("build the node's binaries: missing %s (`make node-tools` installs them)", strings.Join(miss, "; "))
	}
	return ensureSet(dir, v.NodeKey(), "the real node's binaries", "kubelet, containerd, runc, CNI plugins, CoreDNS; about 7 minutes with a warm Go build cache, 20 cold", log,
		func(out string) error { return buildNode(ctx, out, v, log) })
}

func buildNode(ctx context.Context, out string, v Versions, log io.Writer) error {
	if err := os.MkdirAll(filepath.Join(out, cniDir), 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "kubetest-node-build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	g := goRunner{ctx: ctx, log: log}
	if err := buildKubernetes(g, work, out, v, []string{binKubelet, binKubeProxy}); err != nil {
		return err
	}
	gobin := func(dir string) string { return "GOBIN=" + dir }
	// runc needs cgo for libseccomp; the Makefile's libpathrs tag is a
	// Rust library and stays off.
	if err := g.run(work, []string{gobin(out), "CGO_ENABLED=1"}, "install", "-trimpath", "-tags", "seccomp urfave_cli_no_docs",
		"-ldflags", "-s -w -X main.version="+v.Runc, "github.com/opencontainers/runc@v"+v.Runc); err != nil {
		return err
	}
	cd := "github.com/containerd/containerd/v2"
	cdLD := "-s -w -X " + cd + "/version.Version=v" + v.Containerd
	if err := g.run(work, []string{gobin(out)}, "install", "-tags", "urfave_cli_no_docs no_btrfs", "-ldflags", cdLD,
		cd+"/cmd/containerd@v"+v.Containerd, cd+"/cmd/ctr@v"+v.Containerd); err != nil {
		return err
	}
	if err := g.run(work, []string{gobin(out), "CGO_ENABLED=0"}, "install", "-tags", "urfave_cli_no_docs no_grpc", "-ldflags", cdLD,
		cd+"/cmd/containerd-shim-runc-v2@v"+v.Containerd); err != nil {
		return err
	}
	var plugins []string
	for _, p := range cniPlugins {
		plugins = append(plugins, "github.com/containernetworking/plugins/plugins/"+p+"@v"+v.CNIPlugins)
	}
	if err := g.run(work, []string{gobin(filepath.Join(out, cniDir)), "CGO_ENABLED=0"}, append([]string{"install", "-ldflags", "-s -w"}, plugins...)...); err != nil {
		return err
	}
	if err := buildCoreDNS(g, work, out, v); err != nil {
		return err
	}
	return buildPause(g, work, out, v)
}

// coreDNSMain is CoreDNS with only the plugins the node's Corefile uses:
// the documented way to choose plugins at compile time.
const coreDNSMain = `package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/template"
)

func init() {
	dnsserver.Directives = []string{"bind", "errors", "health", "ready", "cache", "kubernetes", "template"}
}

func main() { coremain.Run() }
`

func buildCoreDNS(g goRunner, work, out string, v Versions) error {
	dir := filepath.Join(work, "coredns")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mod := fmt.Sprintf("module talkide.local/coredns\n\ngo 1.26.0\n\nrequire github.com/coredns/coredns v%s\n", v.CoreDNS)
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(coreDNSMain), 0o644); err != nil {
		return err
	}
	if err := g.run(dir, nil, "mod", "tidy"); err != nil {
		return err
	}
	return g.run(dir, []string{"CGO_ENABLED=0"}, "build", "-ldflags", "-s -w", "-o", filepath.Join(out, binCoreDNS), ".")
}

// buildPause compiles Kubernetes' pause.c (from its module) statically and
// wraps it as the image PauseImageRef in an archive for `ctr images import`.
func buildPause(g goRunner, work, out string, v Versions) error {
	kdir, err := g.downloadField("k8s.io/kubernetes@v"+v.Kubernetes, "Dir")
	if err != nil {
		return err
	}
	bin := filepath.Join(work, "pause")
	cmd := exec.CommandContext(g.ctx, "gcc", "-Os", "-static", "-o", bin, filepath.Join(kdir, "build", "pause", "linux", "pause.c"))
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("gcc pause.c: %w\n%s", err, b)
	}
	exe, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: "pause", Mode: 0o755, Size: int64(len(exe)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(exe); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return writeImageArchive(filepath.Join(out, pauseImage), PauseImageRef, layer.Bytes(), v1.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"})
}

// BusyboxImage is a small image the real node has: Debian's static
// busybox with its applets (sh, sleep, cat, nc, nslookup, ...) on PATH.
const BusyboxImage = "kubetest.local/busybox:1"

// busyboxApplets are linked in BusyboxImage's /bin.
var busyboxApplets = []string{"sh", "sleep", "cat", "echo", "ls", "id", "mkdir", "touch", "stat", "nslookup", "nc",
	"wget", "test", "true", "false", "env", "ps", "grep", "wc", "head", "rm", "chmod", "chown", "kill", "mount", "date"}

// writeBusyboxImage writes BusyboxImage, from the host's busybox-static,
// as an archive `ctr images import` takes.
func writeBusyboxImage(path string) error {
	exe, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fmt.Errorf("busybox (Debian package busybox-static; `make node-tools` installs it): %w", err)
	}
	if f, err := elf.NewFile(bytes.NewReader(exe)); err != nil || slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
		return errors.New("/bin/busybox is not a static program: install Debian's busybox-static (it replaces busybox)")
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	hdrs := []*tar.Header{{Name: "bin/", Mode: 0o755, Typeflag: tar.TypeDir}, {Name: "tmp/", Mode: 0o1777, Typeflag: tar.TypeDir},
		{Name: "bin/busybox", Mode: 0o755, Size: int64(len(exe)), Typeflag: tar.TypeReg}}
	for _, a := range busyboxApplets {
		hdrs = append(hdrs, &tar.Header{Name: "bin/" + a, Linkname: "busybox", Typeflag: tar.TypeSymlink, Mode: 0o777})
	}
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Name == "bin/busybox" {
			if _, err := tw.Write(exe); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return writeImageArchive(path, BusyboxImage, layer.Bytes(), v1.Config{Env: []string{"PATH=/bin"}, Cmd: []string{"sh"}})
}

// writeImageArchive writes a one-layer linux/amd64 image named ref to path
// in `docker save` format.
func writeImageArchive(path, ref string, layerTar []byte, cfg v1.Config) error {
	l, err := tarball.LayerFromReader(bytes.NewReader(layerTar))
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return err
	}
	if img, err = mutate.Config(img, cfg); err != nil {
		return err
	}
	if img, err = mutate.ConfigFile(img, withPlatform(img)); err != nil {
		return err
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(path, tag, img)
}

// LayoutDigest is the manifest digest (sha256:…) of the one image of the
// OCI image layout dir, by which pods name it once imported (NodeImage).
func LayoutDigest(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		return "", err
	}
	var idx struct {
		Manifests []struct {
			Digest string `json:"digest"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(b, &idx); err != nil || len(idx.Manifests) != 1 {
		return "", fmt.Errorf("%s/index.json: want one manifest (%v)", dir, err)
	}
	return idx.Manifests[0].Digest, nil
}

// tarDir writes the files under dir to w as a tar archive, with paths
// relative to dir.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		return err
	}
	return tw.Close()
}

// withPlatform is img's config file for linux/amd64 (the runtime refuses an
// image of no platform).
func withPlatform(img v1.Image) *v1.ConfigFile {
	cf, err := img.ConfigFile()
	if err != nil || cf == nil {
		cf = &v1.ConfigFile{}
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	return cf
}
