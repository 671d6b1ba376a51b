package imagebuild

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Result is one written image.
type Result struct {
	Name    string
	Digest  v1.Hash
	Layout  string // absolute path of its OCI image layout
	Tarball string // absolute path of its tarball (docker save format)
	Size    int64  // compressed size: config and layers
}

// Line is the image's line in the output of make images.
func (r Result) Line() string {
	return fmt.Sprintf("image %s@%s %s", r.Name, r.Digest, r.Layout)
}

// Write stores img as the OCI image layout <outDir>/oci/<imageName>/ (its
// index names it by version, annotation org.opencontainers.image.ref.name)
// and as the tarball <outDir>/<imageName>.tar tagged
// talkide/<imageName>:<version>. Both replace what was there.
func Write(img v1.Image, imageName, version, outDir string) (Result, error) {
	outDir, err := filepath.Abs(outDir)
	if err != nil {
		return Result{}, err
	}
	tag, err := name.NewTag("talkide/" + imageName + ":" + version)
	if err != nil {
		return Result{}, fmt.Errorf("image tag: %w", err)
	}
	digest, err := img.Digest()
	if err != nil {
		return Result{}, err
	}
	r := Result{Name: imageName, Digest: digest,
		Layout:  filepath.Join(outDir, "oci", imageName),
		Tarball: filepath.Join(outDir, imageName+".tar")}
	if err := os.MkdirAll(filepath.Dir(r.Layout), 0o755); err != nil {
		return r, err
	}
	// A layout is a directory of blobs: write a fresh one beside the old
	// and swap, so no blob of an older build lingers in it.
	tmp, err := os.MkdirTemp(filepath.Dir(r.Layout), "."+imageName+"-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(tmp)
	lp, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return r, err
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": version,
	})); err != nil {
		return r, fmt.Errorf("write OCI layout: %w", err)
	}
	// Readable by all, as a layout served or copied by another user must be
	// (the library writes some blobs through 0600 temporary files).
	err = filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.Chmod(p, 0o755)
		}
		return os.Chmod(p, 0o644)
	})
	if err != nil {
		return r, err
	}
	if err := os.RemoveAll(r.Layout); err != nil {
		return r, err
	}
	if err := os.Rename(tmp, r.Layout); err != nil {
		return r, err
	}
	tmpTar := r.Tarball + ".tmp"
	if err := tarball.WriteToFile(tmpTar, tag, img); err != nil {
		os.Remove(tmpTar)
		return r, fmt.Errorf("write image tarball: %w", err)
	}
	if err := os.Rename(tmpTar, r.Tarball); err != nil {
		return r, err
	}
	m, err := img.Manifest()
	if err != nil {
		return r, err
	}
	r.Size = m.Config.Size
	for _, l := range m.Layers {
		r.Size += l.Size
	}
	return r, nil
}

// BuildGoBinary builds the main package pkg of the module at moduleDir into
// out as a static linux/amd64 binary that is the same for the same source
// and Go toolchain, whoever builds it: no cgo (the SQLite driver is pure
// Go), -trimpath, no VCS stamp (-buildvcs=false: the image's labels carry
// the version and revision; a stamp would say "modified" for any untracked
// file), no symbol table, an empty build id, and an environment that sets
// every Go setting that changes the code (goBuildEnv) instead of taking the
// builder's.
func BuildGoBinary(ctx context.Context, moduleDir, pkg, out string) error {
	env, err := goEnv(ctx, moduleDir)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w -buildid=", "-o", out, pkg)
	cmd.Dir = moduleDir
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// goBuildEnv are the Go settings of every build, whatever the builder's
// environment or go env file say: GOENV=off so the file (go env -w) is not
// read, and each setting that changes what the compiler and linker produce
// set here, empty where the toolchain's default is meant (GOFLAGS could add
// -gcflags or tags, GOEXPERIMENT and GOFIPS140 change the runtime and
// crypto, GOAMD64 the instructions); GOWORK=off so a go.work above the
// module does not choose other modules.
var goBuildEnv = []string{
	"GOENV=off", "GOWORK=off", "GOFLAGS=",
	"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOAMD64=v1",
	"GOEXPERIMENT=", "GOFIPS140=off",
}

// goFetchSettings are the builder's go settings that say where modules and
// the build cache are and how modules are fetched (and which toolchain
// runs): kept, from the environment or the go env file, because they do not
// change what is built from the same go.sum.
var goFetchSettings = []string{
	"GOPROXY", "GOSUMDB", "GONOSUMDB", "GONOPROXY", "GOPRIVATE", "GOINSECURE", "GOVCS", "GOAUTH",
	"GOMODCACHE", "GOCACHE", "GOPATH", "GOTMPDIR", "GOTOOLCHAIN",
}

// keptEnv are the other variables of the builder's environment the go
// command may need to fetch modules (proxies, certificates, git's and
// ssh's settings for private modules) or to run at all.
var keptEnv = []string{
	"PATH", "HOME", "USER", "TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
	"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
	"SSL_CERT_FILE", "SSL_CERT_DIR", "SSH_AUTH_SOCK", "NETRC",
}

// goEnv is the environment of BuildGoBinary's go command: keptEnv and
// GIT_* from the builder's, goFetchSettings as the builder's go command
// sees them, and goBuildEnv.
func goEnv(ctx context.Context, moduleDir string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "go", append([]string{"env", "-json"}, goFetchSettings...)...)
	cmd.Dir = moduleDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go env: %w\n%s", err, stderr.Bytes())
	}
	var fetch map[string]string
	if err := json.Unmarshal(out, &fetch); err != nil {
		return nil, fmt.Errorf("go env -json: %w", err)
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if slices.Contains(keptEnv, k) || strings.HasPrefix(k, "GIT_") {
			env = append(env, kv)
		}
	}
	for _, k := range goFetchSettings {
		if v := fetch[k]; v != "" {
			env = append(env, k+"="+v)
		}
	}
	return append(env, goBuildEnv...), nil
}
