package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

var (
	epoch    = time.Unix(1_760_000_000, 0).UTC()
	testMeta = Meta{Created: epoch, Version: "v0-test", Revision: "0123abcd", Source: "https://github.com/talkide/talkide"}
)

// controlPlaneBinary builds the real talkide-controlplane once per test run,
// into controlPlaneDir.
var controlPlaneBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "imagebuild-test-")
	if err != nil {
		return "", err
	}
	controlPlaneDir = dir
	out := filepath.Join(dir, "talkide-controlplane")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	return out, BuildGoBinary(ctx, moduleRoot(), "./cmd/talkide-controlplane", out)
})

// controlPlaneDir holds the binary controlPlaneBinary built, if a test
// asked for it: TestMain removes it (and builds nothing when none did).
var controlPlaneDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if controlPlaneDir != "" {
		os.RemoveAll(controlPlaneDir)
	}
	os.Exit(code)
}

func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// tarMember is a member of a test tarball.
type tarMember struct {
	hdr  tar.Header
	data string
}

// writeTar writes members, in the given order, to a new file under dir.
func writeTar(t *testing.T, dir string, members []tarMember) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range members {
		h := m.hdr
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(m.data))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, m.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "base.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	oldTime    = time.Unix(1_600_000_000, 0)
	futureTime = epoch.Add(1000 * time.Hour)
)

// fakeBase is a small stand-in for a Debian base: out of order, with owner
// names, a hard link, files newer than epoch, a setuid and a setgid file
// and a setgid directory (as Debian's su, chage and /var/mail).
func fakeBase(t *testing.T) string {
	t.Helper()
	reg := func(name, data string, mode int64, mt time.Time) tarMember {
		return tarMember{tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, ModTime: mt, Uname: "root", Gname: "root"}, data}
	}
	dir := func(name string, mode int64) tarMember {
		return tarMember{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: oldTime}}
	}
	return writeTar(t, t.TempDir(), []tarMember{
		reg("./usr/bin/tini", "tini", 0o755, oldTime),
		dir("./usr", 0o755), dir("./usr/bin", 0o755), dir("./etc", 0o755), dir("./tmp", 0o1777),
		dir("./etc/ssl", 0o755), dir("./etc/ssl/certs", 0o755),
		reg("./etc/ssl/certs/ca-certificates.crt", "-----BEGIN CERTIFICATE-----\nfake\n", 0o644, futureTime),
		reg("./usr/bin/bwrap", "bwrap", 0o755, oldTime),
		reg("./usr/bin/prlimit", "prlimit", 0o755, oldTime),
		{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "./usr/bin/x-prlimit", Linkname: "./usr/bin/prlimit", ModTime: oldTime}},
		{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "./bin", Linkname: "usr/bin", Mode: 0o777, ModTime: oldTime}},
		dir("./usr/share", 0o755), dir("./usr/share/talkide", 0o755),
		reg("./usr/share/talkide/packages.txt", "bash\t5.2.15-2+b7\n", 0o644, futureTime),
		reg("./usr/bin/su", "su", 0o4755, oldTime),
		reg("./usr/bin/chage", "chage", 0o2755, oldTime),
		dir("./var", 0o755), dir("./var/mail", 0o2775),
	})
}

// fakeClaude is a stand-in for the CLI's package directory.
func fakeClaude(t *testing.T, version string) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]struct {
		data string
		mode os.FileMode
	}{
		"claude":       {"#!/bin/sh\necho " + version + " '(Claude Code)'\n", 0o700},
		"package.json": {`{"name":"@anthropic-ai/claude-code-linux-x64","version":"` + version + `"}`, 0o600},
		"LICENSE.md":   {"license\n", 0o644},
	}
	for n, f := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(f.data), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// layerMembers reads every member of layer (with regular files' content).
func layerMembers(t *testing.T, l v1.Layer) ([]tar.Header, map[string][]byte) {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var hs []tar.Header
	data := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hs, data
		}
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, *h)
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			data[strings.TrimSuffix(h.Name, "/")] = b
		}
	}
}

// checkNormalized asserts what every layer must be: sorted, numeric owners
// only, no time after epoch, no extended attributes.
func checkNormalized(t *testing.T, hs []tar.Header) {
	t.Helper()
	var names []string
	for _, h := range hs {
		names = append(names, strings.TrimSuffix(h.Name, "/"))
		if h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: owner names %q/%q, want none", h.Name, h.Uname, h.Gname)
		}
		if h.ModTime.After(epoch) {
			t.Errorf("%s: mtime %v after SOURCE_DATE_EPOCH %v", h.Name, h.ModTime, epoch)
		}
		if len(h.PAXRecords) > 0 {
			t.Errorf("%s: PAX records %v", h.Name, h.PAXRecords)
		}
	}
	if !slices.IsSorted(names) {
		t.Errorf("layer members not sorted: %v", names)
	}
}

func buildControlPlane(t *testing.T, base string, m Meta) (v1.Image, Result) {
	t.Helper()
	bin, err := controlPlaneBinary()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	img, err := ControlPlaneImage(ControlPlane{Binary: bin, Base: base}, m, filepath.Join(out, "work"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Write(img, ControlPlaneName, m.Version, out)
	if err != nil {
		t.Fatal(err)
	}
	return img, r
}

func TestControlPlaneImageIsReproducible(t *testing.T) {
	base := fakeBase(t)
	_, a := buildControlPlane(t, base, testMeta)
	_, b := buildControlPlane(t, base, testMeta)
	if a.Digest != b.Digest {
		t.Errorf("two builds of the same inputs: digests %s and %s, want equal", a.Digest, b.Digest)
	}
	if a.Layout == b.Layout {
		t.Fatalf("both builds wrote to %s, want separate directories", a.Layout)
	}
	// What is on disk has that digest too.
	for _, r := range []Result{a, b} {
		if got := layoutDigest(t, r.Layout); got != r.Digest {
			t.Errorf("layout %s holds %s, want %s", r.Layout, got, r.Digest)
		}
	}
	// The tarball (docker save format) keeps no manifest: whoever reads it
	// makes a Docker-media-type one, so its digest is not the layout's, but
	// its config and layers are the same blobs, and it is reproducible too.
	ta, tb := tarballImage(t, a.Tarball), tarballImage(t, b.Tarball)
	if da, db := digestOf(t, ta), digestOf(t, tb); da != db {
		t.Errorf("tarballs of two builds read as %s and %s, want equal", da, db)
	}
	for _, img := range []v1.Image{ta, tb} {
		cn, _ := img.ConfigName()
		lm, _ := img.Manifest()
		if want := layoutManifest(t, a); cn != want.Config.Digest || len(lm.Layers) != len(want.Layers) {
			t.Errorf("tarball config %s with %d layers, want the layout's %s with %d", cn, len(lm.Layers), want.Config.Digest, len(want.Layers))
		} else {
			for i := range lm.Layers {
				if lm.Layers[i].Digest != want.Layers[i].Digest {
					t.Errorf("tarball layer %d is %s, want the layout's %s", i, lm.Layers[i].Digest, want.Layers[i].Digest)
				}
			}
		}
	}
	later := testMeta
	later.Created = epoch.Add(time.Hour)
	_, c := buildControlPlane(t, base, later)
	if c.Digest == a.Digest {
		t.Errorf("another SOURCE_DATE_EPOCH gave the same digest %s, want a different one", c.Digest)
	}
}

func tarballImage(t *testing.T, p string) v1.Image {
	t.Helper()
	img, err := tarball.ImageFromPath(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func digestOf(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// layoutImage reads the image of r back from its OCI layout.
func layoutImage(t *testing.T, r Result) v1.Image {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(r.Layout)
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(r.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func layoutManifest(t *testing.T, r Result) *v1.Manifest {
	t.Helper()
	m, err := layoutImage(t, r).Manifest()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func layoutDigest(t *testing.T, dir string) v1.Hash {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("layout %s: %d manifests, want 1", dir, len(im.Manifests))
	}
	return im.Manifests[0].Digest
}

func TestControlPlaneImageContent(t *testing.T) {
	img, r := buildControlPlane(t, fakeBase(t), testMeta)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", c.User)
	}
	if want := []string{"/usr/local/bin/talkide-controlplane"}; !slices.Equal(c.Entrypoint, want) || len(c.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want %q and no cmd", c.Entrypoint, c.Cmd, want)
	}
	if !slices.Contains(c.Env, "TALKIDE_HTTP_ADDR=:8080") {
		t.Errorf("env %q, want TALKIDE_HTTP_ADDR=:8080 in it", c.Env)
	}
	if _, ok := c.ExposedPorts["8080/tcp"]; !ok {
		t.Errorf("exposed ports %v, want 8080/tcp", c.ExposedPorts)
	}
	if c.WorkingDir != "/home/nonroot" {
		t.Errorf("working dir %q, want /home/nonroot", c.WorkingDir)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.title":    "talkide-controlplane",
		"org.opencontainers.image.source":   "https://github.com/talkide/talkide",
		"org.opencontainers.image.revision": "0123abcd",
		"org.opencontainers.image.version":  "v0-test",
		"org.opencontainers.image.created":  "2025-10-09T08:53:20Z",
	}
	for k, v := range wantLabels {
		if c.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], v)
		}
	}
	if !cf.Created.Time.Equal(epoch) || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("created %v os %s arch %s, want %v linux amd64", cf.Created, cf.OS, cf.Architecture, epoch)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	members := map[string]tar.Header{}
	files := map[string][]byte{}
	for _, l := range layers {
		if mt, _ := l.MediaType(); mt != "application/vnd.oci.image.layer.v1.tar+gzip" {
			t.Errorf("layer media type %s, want OCI gzip", mt)
		}
		hs, data := layerMembers(t, l)
		checkNormalized(t, hs)
		for _, h := range hs {
			members[strings.TrimSuffix(h.Name, "/")] = h
		}
		for k, v := range data {
			files[k] = v
		}
	}
	bin := members["usr/local/bin/talkide-controlplane"]
	if bin.Typeflag != tar.TypeReg || bin.Mode != 0o755 || bin.Uid != 0 {
		t.Errorf("binary: type %q mode %o uid %d, want a regular file 0755 of root", bin.Typeflag, bin.Mode, bin.Uid)
	}
	if !strings.Contains(string(files["etc/passwd"]), "nonroot:x:65532:65532:") {
		t.Errorf("etc/passwd:\n%s\nwant a nonroot 65532 entry", files["etc/passwd"])
	}
	if got := string(files["etc/ssl/certs/ca-certificates.crt"]); !strings.Contains(got, "fake") {
		t.Errorf("CA bundle %q, want the base's", got)
	}
	if tmp := members["tmp"]; tmp.Mode != 0o1777 {
		t.Errorf("/tmp mode %o, want 1777", tmp.Mode)
	}
	if h := members["home/nonroot"]; h.Uid != NonrootID || h.Gid != NonrootID {
		t.Errorf("/home/nonroot owned by %d:%d, want 65532:65532", h.Uid, h.Gid)
	}

	// The binary as the image holds it runs (static: no libc in the image).
	p := filepath.Join(t.TempDir(), "talkide-controlplane")
	if err := os.WriteFile(p, files["usr/local/bin/talkide-controlplane"], 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(p, "help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "new-master-key") {
		t.Errorf("talkide-controlplane help from the layer: %v\n%s\nwant its commands listed", err, out)
	}
	if !strings.HasPrefix(r.Line(), "image talkide-controlplane@sha256:") || !strings.HasSuffix(r.Line(), " "+r.Layout) {
		t.Errorf("result line %q, want image talkide-controlplane@sha256:… %s", r.Line(), r.Layout)
	}
}

// TestPushToRegistry pushes the OCI layout to a registry on loopback and
// pulls it back by digest.
func TestPushToRegistry(t *testing.T) {
	_, r := buildControlPlane(t, fakeBase(t), testMeta)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	img := layoutImage(t, r)
	host := strings.TrimPrefix(srv.URL, "http://")
	tag, err := name.NewTag(host+"/talkide/talkide-controlplane:v0-test", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img, remote.WithContext(t.Context())); err != nil {
		t.Fatalf("push: %v", err)
	}
	ref, err := name.NewDigest(host+"/talkide/talkide-controlplane@"+r.Digest.String(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Image(ref, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatalf("pull by digest: %v", err)
	}
	if got, _ := pulled.Digest(); got != r.Digest {
		t.Errorf("pulled %s, want %s", got, r.Digest)
	}
	byTag, err := remote.Image(tag, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatalf("pull by tag: %v", err)
	}
	if got, _ := byTag.Digest(); got != r.Digest {
		t.Errorf("tag resolves to %s, want %s", got, r.Digest)
	}
}

func buildWorker(t *testing.T, w Worker) Result {
	t.Helper()
	out := t.TempDir()
	img, err := WorkerImage(w, testMeta, filepath.Join(out, "work"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Write(img, WorkerName, testMeta.Version, out)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestWorkerImage(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "talkide-worker")
	if err := os.WriteFile(bin, []byte("\x7fELF worker"), 0o700); err != nil {
		t.Fatal(err)
	}
	w := Worker{Binary: bin, ClaudeDir: fakeClaude(t, "2.1.332"), ClaudeVersion: "2.1.332", Base: fakeBase(t)}
	a, b := buildWorker(t, w), buildWorker(t, w)
	if a.Digest != b.Digest {
		t.Errorf("two builds of the same inputs: digests %s and %s, want equal", a.Digest, b.Digest)
	}
	img := layoutImage(t, a)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "0:0" {
		t.Errorf("user %q, want 0:0", c.User)
	}
	if diff := cmp.Diff([]string{"/usr/bin/tini", "--", "/usr/local/bin/talkide-worker"}, c.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-want +got):\n%s", diff)
	}
	if !slices.Contains(c.Env, "TALKIDE_CLAUDE_BIN=/opt/claude-code/claude") {
		t.Errorf("env %q, want TALKIDE_CLAUDE_BIN=/opt/claude-code/claude", c.Env)
	}
	if !slices.ContainsFunc(c.Env, func(e string) bool {
		return strings.HasPrefix(e, "PATH=") && slices.Contains(strings.Split(e[5:], ":"), "/opt/claude-code")
	}) {
		t.Errorf("env %q, want /opt/claude-code on PATH", c.Env)
	}
	req := c.Labels[LabelRequires]
	for _, want := range []string{"runAsUser=0", "SETUID", "seccompProfile=Unconfined", "appArmorProfile=Unconfined", "hostUsers=false with procMount=Unmasked"} {
		if !strings.Contains(req, want) {
			t.Errorf("label %s = %q, want %q in it", LabelRequires, req, want)
		}
	}
	if c.Labels["dev.talkide.claude-code.version"] != "2.1.332" {
		t.Errorf("CLI version label %q, want 2.1.332", c.Labels["dev.talkide.claude-code.version"])
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 3 {
		t.Fatalf("%d layers, want 3 (base, CLI, worker)", len(layers))
	}
	members := map[string]tar.Header{}
	files := map[string][]byte{}
	for _, l := range layers {
		hs, data := layerMembers(t, l)
		checkNormalized(t, hs)
		for _, h := range hs {
			members[strings.TrimSuffix(h.Name, "/")] = h
		}
		for k, v := range data {
			files[k] = v
		}
	}
	for name, mode := range map[string]int64{"opt/claude-code/claude": 0o755, "opt/claude-code/package.json": 0o644,
		"usr/local/bin/talkide-worker": 0o755, "usr/bin/tini": 0o755, "usr/bin/su": 0o755, "usr/bin/chage": 0o755,
		"var/mail": 0o2775} {
		if h, ok := members[name]; !ok || h.Mode != mode {
			t.Errorf("%s: present %v mode %o, want mode %o", name, ok, h.Mode, mode)
		}
	}
	if !strings.Contains(string(files["opt/claude-code/claude"]), "2.1.332") {
		t.Errorf("CLI content %q, want the fake CLI", files["opt/claude-code/claude"])
	}
	if h := members["usr/bin/x-prlimit"]; h.Typeflag != tar.TypeLink || h.Linkname != "usr/bin/prlimit" {
		t.Errorf("hard link: type %q to %q, want a link to usr/bin/prlimit", h.Typeflag, h.Linkname)
	}
	if h := members["usr/bin/tini"]; !h.ModTime.Equal(oldTime) {
		t.Errorf("an older file's mtime became %v, want %v kept", h.ModTime, oldTime)
	}
	if h := members["usr/share/talkide/packages.txt"]; !h.ModTime.Equal(epoch) {
		t.Errorf("a newer file's mtime is %v, want it clamped to %v", h.ModTime, epoch)
	}

	w.ClaudeVersion = "9.9.9"
	if _, err := WorkerImage(w, testMeta, t.TempDir()); err == nil || !strings.Contains(err.Error(), "want the pinned 9.9.9") {
		t.Errorf("CLI of another version than the pin: error %v, want one naming the pin", err)
	}
}

// TestLayersHaveNoSetuidOrSetgidFiles guards against privilege-raising
// binaries in the images (Debian's su, mount, passwd, chage, ssh-agent…):
// nothing in them needs one, so every layer drops the bits, also from a
// base cached before they were dropped. A directory keeps setgid, which
// only makes new files inherit its group.
func TestLayersHaveNoSetuidOrSetgidFiles(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "talkide-worker")
	if err := os.WriteFile(bin, []byte("\x7fELF worker"), 0o4755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(bin, 0o4755); err != nil { // past the umask
		t.Fatal(err)
	}
	base := fakeBase(t)
	w := Worker{Binary: bin, ClaudeDir: fakeClaude(t, "2.1.332"), Base: base}
	worker := layoutImage(t, buildWorker(t, w))
	cp, _ := buildControlPlane(t, base, testMeta)
	seen := 0
	for name, img := range map[string]v1.Image{WorkerName: worker, ControlPlaneName: cp} {
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range layers {
			hs, _ := layerMembers(t, l)
			for _, h := range hs {
				seen++
				if h.Typeflag != tar.TypeDir && h.Mode&0o6000 != 0 {
					t.Errorf("%s: %s has mode %o, want no setuid or setgid bit", name, h.Name, h.Mode)
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no layer members read")
	}
}

func TestBaseKey(t *testing.T) {
	s := BaseSpec{Suite: "bookworm", Mirror: "http://deb.debian.org/debian", Packages: []string{"git", "bash"}}
	same := s
	same.Packages = []string{"bash", "git"}
	if s.Key() != same.Key() {
		t.Errorf("package order changed the key")
	}
	for _, other := range []BaseSpec{
		{Suite: "trixie", Mirror: s.Mirror, Packages: s.Packages},
		{Suite: s.Suite, Mirror: "http://mirror.example/debian", Packages: s.Packages},
		{Suite: s.Suite, Mirror: s.Mirror, Packages: []string{"bash", "git", "jq"}},
	} {
		if other.Key() == s.Key() {
			t.Errorf("%+v has the key of %+v, want another", other, s)
		}
	}
}

// TestCleanAndPackRootfs runs what Base does after debootstrap on a small
// tree: cleaning, then packing with hard links and special modes.
func TestCleanAndPackRootfs(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"etc/machine-id": "0123456789abcdef\n", "etc/hostname": "buildhost\n", "etc/resolv.conf": "nameserver 10.0.0.1\n",
		"var/log/dpkg.log": "installed\n", "var/log/apt/history.log": "x\n", "var/log/wtmp": "",
		"var/lib/apt/lists/deb.debian.org_dists_bookworm_InRelease": "x", "var/cache/apt/pkgcache.bin": "x",
		"var/lib/dpkg/status": "Package: bash\n", "var/lib/dpkg/status-old": "old", "var/cache/ldconfig/aux-cache": "x",
		"usr/bin/a": "same inode", "usr/bin/su": "su", "dev/null": "",
		"usr/share/doc/bash/copyright": "GPL", "usr/share/doc/bash/README.gz": "x", "usr/share/doc/bash/examples/a": "x",
		"usr/share/man/man1/bash.1.gz": "x", "usr/share/locale/de/LC_MESSAGES/bash.mo": "x", "usr/share/locale/locale.alias": "alias",
	}
	for n, data := range files {
		p := filepath.Join(root, n)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(root, "usr/bin/a"), filepath.Join(root, "usr/bin/b")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "usr/bin/su"), os.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("bash", filepath.Join(root, "usr/share/doc/bash-builtins")); err != nil {
		t.Fatal(err)
	}
	if err := cleanRootfs(root); err != nil {
		t.Fatal(err)
	}
	var b layerBuilder
	if err := b.addDir(root); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "rootfs.tar")
	if err := b.writeFile(p, writeOptions{}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := map[string]string{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		desc := string(h.Typeflag) + " " + string(data)
		if h.Typeflag == tar.TypeLink || h.Typeflag == tar.TypeSymlink {
			desc = string(h.Typeflag) + " -> " + h.Linkname
		}
		if h.Mode&0o4000 != 0 {
			desc += " setuid"
		}
		got[strings.TrimSuffix(h.Name, "/")] = desc
	}
	want := map[string]string{
		"bin": "2 -> usr/bin", "dev": "5 ", "etc": "5 ", "etc/hostname": "0 ", "etc/machine-id": "0 ", "etc/resolv.conf": "0 ",
		"usr": "5 ", "usr/bin": "5 ", "usr/bin/a": "0 same inode", "usr/bin/b": "1 -> usr/bin/a", "usr/bin/su": "0 su", // setuid dropped
		"usr/share": "5 ", "usr/share/doc": "5 ", "usr/share/doc/bash": "5 ", "usr/share/doc/bash/copyright": "0 GPL",
		"usr/share/doc/bash-builtins": "2 -> bash", "usr/share/man": "5 ", "usr/share/locale": "5 ", "usr/share/locale/locale.alias": "0 alias",
		"etc/dpkg": "5 ", "etc/dpkg/dpkg.cfg.d": "5 ",
		"etc/dpkg/dpkg.cfg.d/talkide-slim": "0 # TalkIDE worker image (internal/imagebuild): no documentation or translations\n" +
			strings.Join(slimExcludes, "\n") + "\n",
		"var": "5 ", "var/cache": "5 ", "var/cache/apt": "5 ", "var/cache/ldconfig": "5 ",
		"var/lib": "5 ", "var/lib/apt": "5 ", "var/lib/apt/lists": "5 ", "var/lib/dpkg": "5 ", "var/lib/dpkg/status": "0 Package: bash\n",
		"var/log": "5 ", "var/log/apt": "5 ", "var/log/wtmp": "0 ",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("packed rootfs (-want +got):\n%s", diff)
	}
}

// TestBuildGoBinaryIgnoresTheBuildersGoEnvironment guards against digests
// that depend on who builds: the Go settings of the builder's environment
// and go env file (GOFLAGS, GOAMD64, GOEXPERIMENT, GOFIPS140, a go.work)
// and the repository's VCS state (an untracked file made vcs.modified=true)
// must not reach the binary.
func TestBuildGoBinaryIgnoresTheBuildersGoEnvironment(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git: cannot make the repository whose state must not be stamped")
	}
	// A module of its own in a git repository (this worktree's .git is a
	// file, which the go command does not take for a repository).
	mod := t.TempDir()
	for name, data := range map[string]string{
		"go.mod":  "module example.com/hello\n\ngo 1.26\n",
		"main.go": "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello\") }\n",
	} {
		if err := os.WriteFile(filepath.Join(mod, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"init", "-q"}, {"add", "."},
		{"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "hello"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = mod
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(mod, "untracked"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "goenv")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(t.TempDir(), "go.work")
	if err := os.WriteFile(work, []byte("go 1.26\n\nuse "+mod+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	build := func(name string, env map[string]string) (string, *buildinfo.BuildInfo) {
		t.Helper()
		for k, v := range env {
			t.Setenv(k, v)
		}
		out := filepath.Join(t.TempDir(), "hello")
		if err := BuildGoBinary(t.Context(), mod, ".", out); err != nil {
			t.Fatalf("%s build: %v", name, err)
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		bi, err := buildinfo.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range bi.Settings {
			if strings.HasPrefix(s.Key, "vcs") {
				t.Errorf("%s build: setting %s=%s, want no VCS state in the binary", name, s.Key, s.Value)
			}
		}
		return fmt.Sprintf("%x", sha256.Sum256(data)), bi
	}
	// Each build sets every variable any of them sets, so none leaks
	// from the one before. The clean one is the go command's defaults.
	clean, cleanInfo := build("clean", map[string]string{"GOENV": empty, "GOFLAGS": "", "GOAMD64": "",
		"GOEXPERIMENT": "", "GOFIPS140": "", "GOWORK": ""})
	hostile, hostileInfo := build("hostile", map[string]string{"GOENV": empty, "GOFLAGS": "-buildvcs=true -gcflags=all=-N",
		"GOAMD64": "v3", "GOEXPERIMENT": "staticlockranking", "GOFIPS140": "latest", "GOWORK": work})
	if clean != hostile {
		t.Errorf("binary sha256 %s with a clean Go environment, %s with a hostile one; want equal\nclean:\n%v\nhostile:\n%v",
			clean, hostile, cleanInfo, hostileInfo)
	}
	settings := map[string]string{}
	for _, s := range hostileInfo.Settings {
		settings[s.Key] = s.Value
	}
	for k, want := range map[string]string{"-trimpath": "true", "CGO_ENABLED": "0",
		"GOOS": "linux", "GOARCH": "amd64", "GOAMD64": "v1", "GOEXPERIMENT": "", "GOFIPS140": ""} {
		if settings[k] != want {
			t.Errorf("build setting %s=%q, want %q", k, settings[k], want)
		}
	}
}
