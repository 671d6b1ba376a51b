package imagebuild

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

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
// and Go release: no cgo (the SQLite driver is pure Go), -trimpath, no
// symbol table, an empty build id.
func BuildGoBinary(ctx context.Context, moduleDir, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w -buildid=", "-o", out, pkg)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}
