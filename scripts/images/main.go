// Command images builds TalkIDE's OCI images (`make images`):
// talkide-controlplane, talkide-worker and talkide-builder-gradle (the
// image of Gradle build Jobs), reproducibly and without a container daemon
// (internal/imagebuild; docs/images.md).
//
// Outputs, under -out (default .cache/images): oci/<name>/ (an OCI image
// layout), <name>.tar (a tarball for `crane push`), base/<key>/ (the cached
// Debian bases: the worker's, the builder's), <name>.packages.txt (the
// Debian packages of the worker and of the builder) and images.txt.
// Progress goes to stderr; stdout ends with one line per image and nothing
// after:
//
//	image talkide-controlplane@sha256:… /abs/path/.cache/images/oci/talkide-controlplane
//	image talkide-worker@sha256:… /abs/path/.cache/images/oci/talkide-worker
//	image talkide-builder-gradle@sha256:… /abs/path/.cache/images/oci/talkide-builder-gradle
//
// SOURCE_DATE_EPOCH (default: the commit time of HEAD) is every file's
// latest modification time and the images' created time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/talkide/talkide/internal/imagebuild"
)

// config is what one run builds from.
type config struct {
	out       string
	claudeDir string
	suite     string
	mirror    string
	meta      imagebuild.Meta
	pin       string // the pinned CLI version
}

func main() {
	var c config
	flag.StringVar(&c.out, "out", ".cache/images", "output directory")
	flag.StringVar(&c.claudeDir, "claude-dir", ".tools/claude-code/node_modules/@anthropic-ai/claude-code-linux-x64",
		"the native Claude Code CLI package (make tools installs it)")
	flag.StringVar(&c.suite, "suite", "bookworm", "Debian release of the worker's and the builder's bases")
	flag.StringVar(&c.mirror, "mirror", "http://deb.debian.org/debian", "Debian mirror for debootstrap")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := configure(&c)
	if err == nil {
		err = run(ctx, c)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

// configure fills in the image metadata from git and the environment.
func configure(c *config) error {
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", args...).Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		var err error
		if epoch, err = git("log", "-1", "--format=%ct"); err != nil {
			return err
		}
	}
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil || sec <= 0 {
		return fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970", epoch)
	}
	c.meta.Created = time.Unix(sec, 0).UTC()
	if c.meta.Revision, err = git("rev-parse", "HEAD"); err != nil {
		return err
	}
	if c.meta.Version, err = git("describe", "--always", "--dirty"); err != nil {
		return err
	}
	c.meta.Source = "https://github.com/talkide/talkide"
	pin, err := os.ReadFile("internal/worker/claudecli/version.txt")
	if err != nil {
		return fmt.Errorf("the pinned CLI version: %w (run from the module root)", err)
	}
	c.pin = strings.TrimSpace(string(pin))
	return nil
}

func run(ctx context.Context, c config) error {
	start := time.Now()
	log := os.Stderr
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return err
	}
	work := filepath.Join(c.out, "work")
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	spec := imagebuild.BaseSpec{Suite: c.suite, Mirror: c.mirror, Packages: imagebuild.WorkerPackages}
	base, err := imagebuild.Base(ctx, spec, filepath.Join(c.out, "base"), log)
	if err != nil {
		return err
	}
	// The builder's base is one of its own (its packages are its key): it
	// shares nothing with the worker's but minbase, and a build Job's node
	// pulls only it.
	builderSpec := imagebuild.BaseSpec{Suite: c.suite, Mirror: c.mirror, Packages: imagebuild.BuilderGradlePackages}
	builderBase, err := imagebuild.Base(ctx, builderSpec, filepath.Join(c.out, "base"), log)
	if err != nil {
		return err
	}
	fmt.Fprintln(log, "building talkide-controlplane and talkide-worker (static, CGO_ENABLED=0)")
	bins := map[string]string{}
	for _, name := range []string{imagebuild.ControlPlaneName, imagebuild.WorkerName} {
		bins[name] = filepath.Join(work, name)
		if err := imagebuild.BuildGoBinary(ctx, ".", "./cmd/"+name, bins[name]); err != nil {
			return err
		}
	}
	fmt.Fprintf(log, "assembling the images: writing and compressing their layers, about a minute (version %s, SOURCE_DATE_EPOCH %d)\n", c.meta.Version, c.meta.Created.Unix())
	cp, err := imagebuild.ControlPlaneImage(imagebuild.ControlPlane{Binary: bins[imagebuild.ControlPlaneName], Base: base},
		c.meta, filepath.Join(work, "layers-controlplane"))
	if err != nil {
		return fmt.Errorf("%s: %w", imagebuild.ControlPlaneName, err)
	}
	wk, err := imagebuild.WorkerImage(imagebuild.Worker{Binary: bins[imagebuild.WorkerName], ClaudeDir: c.claudeDir,
		ClaudeVersion: c.pin, Base: base}, c.meta, filepath.Join(work, "layers-worker"))
	if err != nil {
		return fmt.Errorf("%s: %w", imagebuild.WorkerName, err)
	}
	bg, err := imagebuild.BuilderGradleImage(imagebuild.BuilderGradle{Base: builderBase}, c.meta, filepath.Join(work, "layers-builder-gradle"))
	if err != nil {
		return fmt.Errorf("%s: %w", imagebuild.BuilderGradleName, err)
	}
	var lines []string
	for _, im := range []struct {
		name string
		img  v1.Image
	}{{imagebuild.ControlPlaneName, cp}, {imagebuild.WorkerName, wk}, {imagebuild.BuilderGradleName, bg}} {
		r, err := imagebuild.Write(im.img, im.name, c.meta.Version, c.out)
		if err != nil {
			return fmt.Errorf("%s: %w", im.name, err)
		}
		fmt.Fprintf(log, "%s: %.1f MB compressed; tarball %s\n", im.name, float64(r.Size)/1e6, r.Tarball)
		lines = append(lines, r.Line())
	}
	for name, b := range map[string]string{imagebuild.WorkerName: base, imagebuild.BuilderGradleName: builderBase} {
		pkgs, err := os.ReadFile(filepath.Join(filepath.Dir(b), "packages.txt"))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(c.out, name+".packages.txt"), pkgs, 0o644); err != nil {
			return err
		}
	}
	text := strings.Join(lines, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(c.out, "images.txt"), []byte(text), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(log, "images built in %s\n", time.Since(start).Round(time.Second))
	if _, err := os.Stdout.WriteString(text); err != nil {
		return errors.Join(errors.New("print the image lines"), err)
	}
	return nil
}
