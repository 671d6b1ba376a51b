package imagebuild

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Image names, as in the `image NAME@sha256:… PATH` lines of make images.
const (
	ControlPlaneName  = "talkide-controlplane"
	WorkerName        = "talkide-worker"
	BuilderGradleName = "talkide-builder-gradle"
)

// Paths and ids inside the images.
const (
	ControlPlaneBin = "/usr/local/bin/talkide-controlplane"
	WorkerBin       = "/usr/local/bin/talkide-worker"
	ClaudeDir       = "/opt/claude-code"
	ClaudeBin       = ClaudeDir + "/claude"
	NonrootID       = 65532
	// The Gradle builder's directories: the working tree and the Gradle
	// home a build Job mounts (internal/worker/buildjob), and its JDK.
	BuilderWorkspace  = "/workspace"
	BuilderGradleHome = "/gradle-home"
	BuilderJavaHome   = "/usr/lib/jvm/java-17-openjdk-amd64"
	// caPath is the CA bundle, where Go's crypto/x509 looks first on Linux.
	caPath = "etc/ssl/certs/ca-certificates.crt"
)

// LabelRequires is the worker image's label that lists what its pod must
// give it (docs/images.md says why each).
const LabelRequires = "dev.talkide.runtime.requires"

// WorkerRequires is the value of LabelRequires: the worker's pod spec as
// internal/controlplane/provision writes it (root with the capabilities that give agents
// their uids and directories, no seccomp or AppArmor filter, so bubblewrap
// may make user namespaces) and what gives the stronger guarantees where a
// cluster allows (docs/deploying.md, "Choosing the worker's pod").
const WorkerRequires = "runAsUser=0; capabilities=CHOWN,DAC_OVERRIDE,FOWNER,KILL,SETGID,SETUID; seccompProfile=Unconfined; " +
	"appArmorProfile=Unconfined; stronger where given: hostUsers=false with procMount=Unmasked (a private /proc per agent; " +
	"needs a session volume with idmapped mounts), a writable cgroup (a cgroup per agent)"

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Meta is what an image says about where it comes from.
type Meta struct {
	// Created is SOURCE_DATE_EPOCH: the config's created time and the
	// latest modification time of any file in a layer.
	Created time.Time
	// Version is the image's version (git describe), its tag.
	Version string
	// Revision is the commit it was built from.
	Revision string
	// Source is the repository's URL.
	Source string
}

func (m Meta) labels(title, description string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       title,
		"org.opencontainers.image.description": description,
		"org.opencontainers.image.source":      m.Source,
		"org.opencontainers.image.revision":    m.Revision,
		"org.opencontainers.image.version":     m.Version,
		"org.opencontainers.image.created":     m.Created.UTC().Format(time.RFC3339),
	}
}

// ControlPlane is what the control-plane image is made of.
type ControlPlane struct {
	// Binary is the static talkide-controlplane binary (BuildGoBinary).
	Binary string
	// Base is a Debian base tarball (Base); only its CA bundle is taken.
	Base string
}

// ControlPlaneImage assembles the control-plane image: a base layer with
// /etc/passwd and /etc/group (root and nonroot 65532), the CA bundle, /tmp
// and nonroot's home, and a layer with the binary. It runs as 65532, serves
// on :8080, and works in /home/nonroot (the SQLite default talkide.db is
// relative to it).
func ControlPlaneImage(c ControlPlane, m Meta, workDir string) (v1.Image, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	ca, err := baseFile(c.Base, caPath)
	if err != nil {
		return nil, err
	}
	var base layerBuilder
	for _, d := range []struct {
		name     string
		mode     int64
		uid, gid int
	}{
		{"etc", 0o755, 0, 0}, {"etc/ssl", 0o755, 0, 0}, {"etc/ssl/certs", 0o755, 0, 0},
		{"home", 0o755, 0, 0}, {"home/nonroot", 0o700, NonrootID, NonrootID},
		{"root", 0o700, 0, 0}, {"tmp", 0o1777, 0, 0},
		{"usr", 0o755, 0, 0}, {"usr/local", 0o755, 0, 0}, {"usr/local/bin", 0o755, 0, 0},
	} {
		if err := base.dir(d.name, d.mode, d.uid, d.gid); err != nil {
			return nil, err
		}
	}
	files := map[string]string{
		"etc/passwd":        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
		"etc/group":         "root:x:0:\nnonroot:x:65532:\n",
		"etc/nsswitch.conf": "hosts: files dns\n",
		caPath:              string(ca),
	}
	for name, data := range files {
		if err := base.file(name, 0o644, []byte(data)); err != nil {
			return nil, err
		}
	}
	var bin layerBuilder
	if err := bin.fileFrom(ControlPlaneBin, c.Binary); err != nil {
		return nil, err
	}
	layers, err := buildLayers(workDir, m.Created, []namedLayer{
		{"base", "passwd, group, CA bundle, /tmp, /home/nonroot", &base},
		{"bin", "talkide-controlplane", &bin},
	})
	if err != nil {
		return nil, err
	}
	nonroot := fmt.Sprintf("%d:%d", NonrootID, NonrootID)
	return assemble(layers, m, v1.Config{
		User:         nonroot,
		Entrypoint:   []string{ControlPlaneBin},
		Env:          []string{"PATH=" + defaultPath, "HOME=/home/nonroot", "TALKIDE_HTTP_ADDR=:8080"},
		ExposedPorts: map[string]struct{}{"8080/tcp": {}},
		WorkingDir:   "/home/nonroot",
		Labels: m.labels(ControlPlaneName, "TalkIDE control plane: browser API, mint endpoint, gateway-proxy, "+
			"worker provisioner (no arguments: serve; `help` lists operator commands)"),
	})
}

// Worker is what the worker image is made of.
type Worker struct {
	// Binary is the static talkide-worker binary (BuildGoBinary).
	Binary string
	// ClaudeDir is the directory of the native Claude Code CLI package
	// (@anthropic-ai/claude-code-linux-x64: claude, package.json, …).
	ClaudeDir string
	// ClaudeVersion, when set, must be the version in ClaudeDir's
	// package.json (the pin, internal/worker/claudecli/version.txt).
	ClaudeVersion string
	// Base is the Debian base tarball (Base).
	Base string
}

// WorkerImage assembles the worker image: the Debian base as one layer, the
// CLI at /opt/claude-code as another, the worker binary as a third (so a new
// worker version changes only the smallest layer). It runs as uid 0 under
// tini, and says in LabelRequires what its pod must allow.
func WorkerImage(w Worker, m Meta, workDir string) (v1.Image, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	cliVersion, err := claudeVersion(w.ClaudeDir)
	if err != nil {
		return nil, err
	}
	if w.ClaudeVersion != "" && cliVersion != w.ClaudeVersion {
		return nil, fmt.Errorf("Claude Code CLI in %s is %s, want the pinned %s (make tools)", w.ClaudeDir, cliVersion, w.ClaudeVersion)
	}
	var base layerBuilder
	f, err := os.Open(w.Base)
	if err != nil {
		return nil, err
	}
	err = base.addTar(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	for _, need := range []string{"usr/bin/tini", "usr/bin/bwrap", "usr/bin/prlimit", PackagesPath} {
		if _, ok := base.lookup(need); !ok {
			return nil, fmt.Errorf("base %s has no %s", w.Base, need)
		}
	}
	var cli layerBuilder
	if err := cli.dir(ClaudeDir, 0o755, 0, 0); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(w.ClaudeDir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return nil, fmt.Errorf("%s: only files expected in the CLI's package, found %s", w.ClaudeDir, e.Name())
		}
		if err := cli.fileFrom(ClaudeDir+"/"+e.Name(), filepath.Join(w.ClaudeDir, e.Name())); err != nil {
			return nil, err
		}
	}
	if data, ok := cli.lookup(strings.TrimPrefix(ClaudeBin, "/")); !ok || len(data) == 0 {
		return nil, fmt.Errorf("%s has no claude binary", w.ClaudeDir)
	}
	var bin layerBuilder
	if err := bin.fileFrom(WorkerBin, w.Binary); err != nil {
		return nil, err
	}
	layers, err := buildLayers(workDir, m.Created, []namedLayer{
		{"debian", "Debian base (debootstrap minbase + " + strings.Join(WorkerPackages, " ") + ")", &base},
		{"claude-code", "Claude Code CLI " + cliVersion, &cli},
		{"bin", "talkide-worker", &bin},
	})
	if err != nil {
		return nil, err
	}
	labels := m.labels(WorkerName, "TalkIDE worker: runs the Claude Code CLI for each conversation of one tenant-env, "+
		"every agent jailed with bubblewrap; its pod must allow what "+LabelRequires+" lists (docs/images.md)")
	labels[LabelRequires] = WorkerRequires
	labels["dev.talkide.claude-code.version"] = cliVersion
	return assemble(layers, m, v1.Config{
		User:         "0:0",
		Entrypoint:   []string{"/usr/bin/tini", "--", WorkerBin},
		Env:          []string{"PATH=" + ClaudeDir + ":" + defaultPath, "TALKIDE_CLAUDE_BIN=" + ClaudeBin},
		ExposedPorts: map[string]struct{}{"8080/tcp": {}},
		WorkingDir:   "/",
		Labels:       labels,
	})
}

// BuilderGradleRequires is the builder image's LabelRequires: it runs as
// any uid, root or not, with nothing added to the pod's defaults, but
// needs its three working directories writable (see BuilderGradleImage).
const BuilderGradleRequires = "runAsNonRoot with any uid (no passwd entry needed); no capabilities; " +
	"seccompProfile=RuntimeDefault; writable " + BuilderWorkspace + " (the working tree), " +
	BuilderGradleHome + " (GRADLE_USER_HOME, HOME) and /tmp: mount them when readOnlyRootFilesystem"

// BuilderGradle is what the Gradle builder image is made of.
type BuilderGradle struct {
	// Base is the Debian base tarball made with BuilderGradlePackages
	// (Base).
	Base string
}

// BuilderGradleImage assembles the image build Jobs run Gradle in
// (internal/worker/buildjob's GradleJobBuilder): the Debian base with Gradle, the
// JDK and JUnit 4 as one layer, and a layer with the directories a Job
// mounts, /workspace and /gradle-home, mode 1777 like /tmp, so that the
// image also runs unmounted as any uid. No entrypoint and no command: the
// Job gives both (/bin/sh removing the earlier reports, then `gradle
// --no-daemon --console=plain <tasks>`), gradle being on PATH. Its user is 65532, with no passwd entry, as the Job's
// agent uid has none: HOME and GRADLE_USER_HOME are the Gradle home, and
// JAVA_TOOL_OPTIONS makes it every JVM's user.home too (Gradle's, its test
// workers', javac's), which the JDK would otherwise set to "?" for a uid
// it cannot look up, and a build's ~/.m2 would land in a directory "?" of
// the working tree; each JVM says so in one line, "Picked up
// JAVA_TOOL_OPTIONS". LANG=C.UTF-8 so javac reads UTF-8 sources and the
// JVM takes file names as UTF-8; JAVA_HOME is the JDK. Labels name the
// versions of Gradle, the JDK and JUnit the base holds.
func BuilderGradleImage(b BuilderGradle, m Meta, workDir string) (v1.Image, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	var base layerBuilder
	f, err := os.Open(b.Base)
	if err != nil {
		return nil, err
	}
	err = base.addTar(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	jdk := strings.TrimPrefix(BuilderJavaHome, "/")
	for _, need := range []string{"usr/bin/gradle", "usr/bin/java", jdk + "/bin/java", jdk + "/bin/javac",
		"usr/share/java/junit4.jar", "usr/share/java/hamcrest.jar", "usr/share/maven-repo/junit/junit", PackagesPath} {
		if _, ok := base.header(need); !ok {
			return nil, fmt.Errorf("base %s has no %s", b.Base, need)
		}
	}
	if h, ok := base.header("tmp"); !ok || h.Typeflag != tar.TypeDir || h.Mode&0o1777 != 0o1777 {
		return nil, fmt.Errorf("base %s: /tmp is not a directory of mode 1777", b.Base)
	}
	pkgs, _ := base.lookup(PackagesPath)
	versions := debianVersions(pkgs)
	labels := m.labels(BuilderGradleName, "TalkIDE Gradle builder: Debian's Gradle, OpenJDK 17 and JUnit 4, "+
		"the image of a conversation's build Jobs (`gradle --no-daemon --console=plain <tasks>` in "+BuilderWorkspace+"); runs as any uid")
	labels[LabelRequires] = BuilderGradleRequires
	for label, pkg := range map[string]string{"dev.talkide.gradle.version": "gradle",
		"dev.talkide.jdk.version": "openjdk-17-jdk-headless", "dev.talkide.junit.version": "junit4"} {
		v, ok := versions[pkg]
		if !ok {
			return nil, fmt.Errorf("base %s: %s lists no package %s", b.Base, PackagesPath, pkg)
		}
		labels[label] = v
	}
	var dirs layerBuilder
	for _, d := range []string{BuilderGradleHome, BuilderWorkspace} {
		if err := dirs.dir(d, 0o1777, 0, 0); err != nil {
			return nil, err
		}
	}
	layers, err := buildLayers(workDir, m.Created, []namedLayer{
		{"debian", "Debian base (debootstrap minbase + " + strings.Join(BuilderGradlePackages, " ") + ")", &base},
		{"dirs", BuilderGradleHome + " and " + BuilderWorkspace + ", writable by any uid", &dirs},
	})
	if err != nil {
		return nil, err
	}
	return assemble(layers, m, v1.Config{
		User: fmt.Sprintf("%d:%d", NonrootID, NonrootID),
		Env: []string{"PATH=" + defaultPath, "JAVA_HOME=" + BuilderJavaHome, "LANG=C.UTF-8",
			"GRADLE_USER_HOME=" + BuilderGradleHome, "HOME=" + BuilderGradleHome,
			"JAVA_TOOL_OPTIONS=-Duser.home=" + BuilderGradleHome},
		WorkingDir: BuilderWorkspace,
		Labels:     labels,
	})
}

// debianVersions reads `dpkg-query -W` output: package name (without an
// architecture) to version.
func debianVersions(list []byte) map[string]string {
	out := map[string]string{}
	for line := range strings.Lines(string(list)) {
		name, version, ok := strings.Cut(strings.TrimRight(line, "\n"), "\t")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(name, ":")
		out[name] = version
	}
	return out
}

func (m Meta) check() error {
	if m.Created.IsZero() {
		return errors.New("image metadata: no created time (SOURCE_DATE_EPOCH)")
	}
	if m.Version == "" {
		return errors.New("image metadata: no version")
	}
	return nil
}

type namedLayer struct {
	file    string
	comment string
	b       *layerBuilder
}

type builtLayer struct {
	layer   v1.Layer
	comment string
}

// buildLayers writes each layer to <workDir>/<file>.tar.gz, two at a time
// (compressing a few hundred megabytes is the slow part).
func buildLayers(workDir string, clamp time.Time, ls []namedLayer) ([]builtLayer, error) {
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return nil, err
	}
	out := make([]builtLayer, len(ls))
	errs := make([]error, len(ls))
	sem := make(chan struct{}, 2)
	done := make(chan struct{})
	for i, l := range ls {
		go func() {
			sem <- struct{}{}
			defer func() { <-sem; done <- struct{}{} }()
			layer, err := l.b.layer(filepath.Join(workDir, l.file+".tar.gz"), clamp)
			out[i], errs[i] = builtLayer{layer, l.comment}, err
		}()
	}
	for range ls {
		<-done
	}
	return out, errors.Join(errs...)
}

// assemble makes an OCI image (OCI media types, linux/amd64) of layers and
// cfg, with every time in it set to m.Created.
func assemble(layers []builtLayer, m Meta, cfg v1.Config) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	created := v1.Time{Time: m.Created.UTC()}
	var adds []mutate.Addendum
	for _, l := range layers {
		adds = append(adds, mutate.Addendum{Layer: l.layer, MediaType: types.OCILayer,
			History: v1.History{Created: created, CreatedBy: "talkide imagebuild", Comment: l.comment}})
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = created
	cf.Config = cfg
	return mutate.ConfigFile(img, cf)
}

// baseFile returns the content of the regular file name in the base
// tarball at p.
func baseFile(p, name string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("base %s has no %s", p, name)
		}
		if err != nil {
			return nil, fmt.Errorf("read base %s: %w", p, err)
		}
		if n, _ := cleanName(h.Name); n == name && h.Typeflag == tar.TypeReg {
			return io.ReadAll(tr)
		}
	}
}

// claudeVersion reads the version of the CLI package in dir.
func claudeVersion(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		return "", fmt.Errorf("Claude Code CLI package: %w (make tools installs it)", err)
	}
	var pkg struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(data, &pkg); err != nil || pkg.Version == "" {
		return "", fmt.Errorf("%s/package.json: no version", dir)
	}
	return pkg.Version, nil
}
