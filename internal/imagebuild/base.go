package imagebuild

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"
)

// baseRecipe versions what Base does to a root filesystem after debootstrap
// (the cleaning, the package list file). It is part of the cache key:
// change it whenever that changes, so old caches are not reused.
const baseRecipe = "talkide-base-2"

// PackagesPath is where the base records its installed packages
// (`dpkg-query -W`), inside the image.
const PackagesPath = "usr/share/talkide/packages.txt"

// WorkerPackages are the Debian packages the worker image has besides
// minbase: what an agent works with, and what containment needs
// (bubblewrap; util-linux's prlimit; tini as PID 1 to reap orphans).
var WorkerPackages = []string{
	// the agent's tools
	"bash", "ca-certificates", "curl", "gcc", "git", "jq", "less", "libc6-dev", "make",
	"openssh-client", "patch", "procps", "ripgrep", "unzip", "xz-utils",
	// containment and process management
	"bubblewrap", "tini", "util-linux",
}

// BuilderGradlePackages are the Debian packages of the Gradle builder
// image besides minbase: Debian's Gradle (4.4.1), the JDK it compiles
// with, and JUnit 4 with Hamcrest, whose jars and Maven metadata are in
// /usr/share/java and /usr/share/maven-repo, so a project's tests resolve
// them offline. The same toolchain as the local runner's on one machine,
// so a project builds the same way in a Job. ca-certificates (and the JDK's
// ca-certificates-java) for dependencies fetched over HTTPS.
var BuilderGradlePackages = []string{
	"ca-certificates", "gradle", "junit4", "libhamcrest-java", "openjdk-17-jdk-headless",
}

// BaseSpec is a Debian root filesystem to make with debootstrap.
type BaseSpec struct {
	// Suite is the Debian release, e.g. "bookworm".
	Suite string
	// Mirror is the Debian archive, e.g. "http://deb.debian.org/debian".
	Mirror string
	// Packages are installed besides minbase's (with their dependencies).
	Packages []string
}

// Key names the cache entry of s: a hash of the suite, mirror, sorted
// package list, architecture and baseRecipe.
func (s BaseSpec) Key() string {
	pk := slices.Clone(s.Packages)
	sort.Strings(pk)
	h := sha256.New()
	fmt.Fprintf(h, "%s\nsuite=%s\nmirror=%s\narch=amd64\nvariant=minbase\npackages=%s\n",
		baseRecipe, s.Suite, s.Mirror, strings.Join(pk, ","))
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Base returns the base root filesystem tarball of s, from the cache
// <cacheDir>/<key>/rootfs.tar when there, else made with debootstrap (as
// root; debootstrap is installed with apt-get when missing) and cached. The
// package list is beside it as packages.txt, and inside it at PackagesPath.
// Progress goes to progress.
func Base(ctx context.Context, s BaseSpec, cacheDir string, progress io.Writer) (string, error) {
	cacheDir, err := filepath.Abs(cacheDir)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cacheDir, s.Key())
	tarPath := filepath.Join(dir, "rootfs.tar")
	if _, err := os.Stat(tarPath); err == nil {
		fmt.Fprintf(progress, "using the cached Debian base %s\n", dir)
		return tarPath, nil
	}
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("make the Debian base: debootstrap needs root (it chroots and creates device nodes); run as root, or copy a cache %s made elsewhere", dir)
	}
	deb, err := ensureDebootstrap(ctx, progress)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	work, err := os.MkdirTemp(cacheDir, ".build-"+s.Key()+"-")
	if err != nil {
		return "", err
	}
	defer removeBuildDir(work)
	rootfs := filepath.Join(work, "rootfs")
	fmt.Fprintf(progress, "building the Debian base with debootstrap (2 to 5 minutes the first time; cached in %s)\n", dir)
	start := time.Now()
	logPath := filepath.Join(work, "debootstrap.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "nice", "-n", "10", deb, "--variant=minbase", "--arch=amd64",
		"--include="+strings.Join(s.Packages, ","), s.Suite, rootfs, s.Mirror)
	cmd.Stdout, cmd.Stderr = logf, logf
	err = cmd.Run()
	logf.Close()
	if err != nil {
		log, _ := os.ReadFile(logPath)
		return "", fmt.Errorf("debootstrap %s from %s: %w; its log ends:\n%s", s.Suite, s.Mirror, err, tail(log, 15))
	}
	fmt.Fprintf(progress, "debootstrap done in %s; cleaning and packing the base\n", time.Since(start).Round(time.Second))
	pkgs, err := exec.CommandContext(ctx, "chroot", rootfs, "dpkg-query", "-W").Output()
	if err != nil {
		return "", fmt.Errorf("list the base's packages (dpkg-query -W in the chroot): %w", err)
	}
	if err := cleanRootfs(rootfs); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(rootfs, filepath.Dir(PackagesPath)), 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(rootfs, PackagesPath), pkgs, 0o644); err != nil {
		return "", err
	}
	var b layerBuilder
	if err := b.addDir(rootfs); err != nil {
		return "", err
	}
	if err := b.writeFile(filepath.Join(work, "rootfs.tar"), writeOptions{}); err != nil {
		return "", err
	}
	spec := fmt.Sprintf("suite=%s\nmirror=%s\npackages=%s\nrecipe=%s\nmade=%s\n",
		s.Suite, s.Mirror, strings.Join(s.Packages, ","), baseRecipe, time.Now().UTC().Format(time.RFC3339))
	for name, data := range map[string][]byte{"packages.txt": pkgs, "spec.txt": []byte(spec)} {
		if err := os.WriteFile(filepath.Join(work, name), data, 0o644); err != nil {
			return "", err
		}
	}
	if err := os.RemoveAll(rootfs); err != nil {
		return "", err
	}
	os.RemoveAll(dir) // a half-made entry of an older run
	if err := os.Chmod(work, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(work, dir); err != nil {
		return "", err
	}
	fmt.Fprintf(progress, "Debian base cached in %s (%s in all)\n", dir, time.Since(start).Round(time.Second))
	return tarPath, nil
}

// ensureDebootstrap returns debootstrap's path, installing Debian's package
// with apt-get when it is missing (the caller is root).
func ensureDebootstrap(ctx context.Context, progress io.Writer) (string, error) {
	if p, err := exec.LookPath("debootstrap"); err == nil {
		return p, nil
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "", errors.New("make the Debian base: debootstrap is not installed and there is no apt-get to install it: install debootstrap (https://wiki.debian.org/Debootstrap)")
	}
	fmt.Fprintln(progress, "installing debootstrap (Debian's package) to make the worker's base")
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "debootstrap"}} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("install debootstrap: apt-get %s: %w\n%s", strings.Join(args, " "), err, tail(out, 10))
		}
	}
	return exec.LookPath("debootstrap")
}

// cleanRootfs removes from a fresh debootstrap what changes from run to run
// or belongs to the machine it ran on: apt's lists and caches, logs, dpkg's
// and debconf's backups, ldconfig's aux-cache, the host's resolv.conf and
// hostname (the runtime mounts its own: they are left empty), device nodes,
// and makes machine-id empty (systemd's convention for "not yet set").
func cleanRootfs(root string) error {
	// Contents removed, directories kept.
	for _, d := range []string{"var/lib/apt/lists", "var/cache/apt", "dev", "run", "tmp", "var/tmp", "proc", "sys"} {
		if err := emptyDir(filepath.Join(root, d)); err != nil {
			return err
		}
	}
	// Logs with something in them go; the empty ones packages made with
	// their owners and modes (wtmp, btmp, lastlog: group utmp) stay.
	err := filepath.WalkDir(filepath.Join(root, "var/log"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		if fi, err := d.Info(); err != nil || fi.Size() > 0 {
			return os.Remove(p)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, g := range []string{"var/lib/dpkg/*-old", "var/cache/debconf/*-old", "var/cache/ldconfig/aux-cache",
		"var/lib/dbus/machine-id", "root/.bash_history"} {
		ms, _ := filepath.Glob(filepath.Join(root, g))
		for _, m := range ms {
			if err := os.Remove(m); err != nil {
				return err
			}
		}
	}
	if err := slim(root); err != nil {
		return err
	}
	for _, f := range []string{"etc/machine-id", "etc/resolv.conf", "etc/hostname"} {
		p := filepath.Join(root, f)
		os.Remove(p) // it may be a symlink into the host's /run
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// slimExcludes are the documentation and translations the worker's base
// leaves out, as dpkg path-exclude patterns (Debian's own slim images do
// the same): about 80 MB that no agent reads. Copyright files stay.
var slimExcludes = []string{
	"path-exclude /usr/share/doc/*",
	"path-include /usr/share/doc/*/copyright",
	"path-exclude /usr/share/man/*",
	"path-exclude /usr/share/info/*",
	"path-exclude /usr/share/locale/*",
	"path-include /usr/share/locale/locale.alias",
}

// slim removes what slimExcludes name and writes them as a dpkg setting,
// so packages installed later in the image leave them out too.
func slim(root string) error {
	for _, d := range []string{"usr/share/man", "usr/share/info"} {
		if err := emptyDir(filepath.Join(root, d)); err != nil {
			return err
		}
	}
	locale := filepath.Join(root, "usr/share/locale")
	ents, _ := os.ReadDir(locale)
	for _, e := range ents {
		if e.Name() != "locale.alias" {
			if err := os.RemoveAll(filepath.Join(locale, e.Name())); err != nil {
				return err
			}
		}
	}
	doc := filepath.Join(root, "usr/share/doc")
	err := filepath.WalkDir(doc, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == doc {
			return err
		}
		rel, _ := filepath.Rel(doc, p)
		if !strings.Contains(rel, "/") {
			return nil // a package's directory (or a link to another's)
		}
		if filepath.Base(p) == "copyright" && !strings.Contains(filepath.Dir(rel), "/") {
			return nil
		}
		if err := os.RemoveAll(p); err != nil {
			return err
		}
		if d.IsDir() {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	cfg := filepath.Join(root, "etc/dpkg/dpkg.cfg.d")
	if err := os.MkdirAll(cfg, 0o755); err != nil {
		return err
	}
	text := "# TalkIDE worker image (internal/imagebuild): no documentation or translations\n" + strings.Join(slimExcludes, "\n") + "\n"
	return os.WriteFile(filepath.Join(cfg, "talkide-slim"), []byte(text), 0o644)
}

// emptyDir removes what is in dir (below any mount point it crosses, which
// it refuses to: debootstrap's /proc and /sys must be unmounted by now).
func emptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if mounted(dir) {
		return fmt.Errorf("clean the base: %s is still a mount point", dir)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// mounts returns the mount points at or below dir, deepest first.
func mounts(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	abs, _ := filepath.Abs(dir)
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == abs || strings.HasPrefix(mp, abs+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func mounted(dir string) bool { return len(mounts(dir)) > 0 }

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// removeBuildDir removes a debootstrap work directory, first unmounting
// what a failed debootstrap may have left mounted in it (its /proc, /sys):
// removing through a mounted /proc or /sys would reach the host's.
func removeBuildDir(dir string) {
	for _, mp := range mounts(dir) {
		syscall.Unmount(mp, syscall.MNT_DETACH)
	}
	if mounted(dir) {
		fmt.Fprintf(os.Stderr, "imagebuild: left %s in place: something is still mounted in it\n", dir)
		return
	}
	os.RemoveAll(dir)
}

// addDir adds the tree at root (not root itself) as it is on disk: types,
// modes (with setuid, setgid and sticky bits, though writeTo drops the
// first two from files), numeric owners and times.
// Hard links become links to the first of their names in sorted order.
// Sockets are skipped; device nodes are an error (cleanRootfs removed
// /dev's).
func (b *layerBuilder) addDir(root string) error {
	type item struct {
		name string
		path string
		fi   fs.FileInfo
	}
	var items []item
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		items = append(items, item{filepath.ToSlash(rel), p, fi})
		return nil
	})
	if err != nil {
		return err
	}
	sort.Slice(items, func(i, j int) bool { return items[i].name < items[j].name })
	type inode struct{ dev, ino uint64 }
	first := map[inode]string{}
	for _, it := range items {
		st, ok := it.fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat", it.path)
		}
		h := tar.Header{Name: it.name, Mode: tarMode(it.fi.Mode()), Uid: int(st.Uid), Gid: int(st.Gid), ModTime: it.fi.ModTime()}
		e := entry{}
		m := it.fi.Mode()
		switch {
		case m.IsRegular():
			key := inode{uint64(st.Dev), st.Ino}
			if st.Nlink > 1 {
				if target, ok := first[key]; ok {
					h.Typeflag, h.Linkname = tar.TypeLink, target
					break
				}
				first[key] = it.name
			}
			h.Typeflag, h.Size = tar.TypeReg, it.fi.Size()
			e.path = it.path
		case m.IsDir():
			h.Typeflag = tar.TypeDir
		case m&fs.ModeSymlink != 0:
			h.Typeflag = tar.TypeSymlink
			if h.Linkname, err = os.Readlink(it.path); err != nil {
				return err
			}
		case m&fs.ModeNamedPipe != 0:
			h.Typeflag = tar.TypeFifo
		case m&fs.ModeSocket != 0:
			continue
		default:
			return fmt.Errorf("%s: a %v has no place in a layer", it.path, m.Type())
		}
		e.hdr = h
		if err := b.add(e); err != nil {
			return err
		}
	}
	return nil
}

// tarMode is a file mode as tar's mode field: permissions and the setuid,
// setgid and sticky bits.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

func tail(b []byte, lines int) string {
	ls := strings.Split(strings.TrimRight(string(bytes.TrimSpace(b)), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}
