package imagebuild

import (
	"archive/tar"
	"bytes"
	"encoding/xml"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/talkide/talkide/internal/worker/buildjob"
)

// fakeBuilderBase is a small stand-in for the Gradle builder's Debian
// base: the paths BuilderGradleImage checks, its package list, /tmp, and a
// setuid file.
func fakeBuilderBase(t *testing.T, leaveOut string) string {
	t.Helper()
	members := []tarMember{
		{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./tmp/", Mode: 0o1777, ModTime: oldTime}},
		{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "./bin", Linkname: "usr/bin", Mode: 0o777, ModTime: oldTime}},
		{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "./usr/bin/sh", Linkname: "dash", Mode: 0o777, ModTime: oldTime}},
		{tar.Header{Typeflag: tar.TypeReg, Name: "./usr/bin/dash", Mode: 0o755, ModTime: oldTime}, "dash"},
		{tar.Header{Typeflag: tar.TypeReg, Name: "./usr/bin/rm", Mode: 0o755, ModTime: oldTime}, "rm"},
		{tar.Header{Typeflag: tar.TypeReg, Name: "./usr/share/gradle/bin/gradle", Mode: 0o755, ModTime: oldTime}, "#!/bin/sh"},
		{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "./usr/bin/gradle", Linkname: "../share/gradle/bin/gradle", Mode: 0o777, ModTime: oldTime}},
		{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "./usr/bin/java", Linkname: "/etc/alternatives/java", Mode: 0o777, ModTime: oldTime}},
		{tar.Header{Typeflag: tar.TypeReg, Name: "./usr/lib/jvm/java-17-openjdk-amd64/bin/java", Mode: 0o755, ModTime: oldTime}, "java"},
		{tar.Header{Typeflag: tar.TypeReg, Name: "./usr/lib/jvm/java-17-openjdk-amd64/bin/javac", Mode: 0o755, ModTime: oldTime}, "javac"},
		{tar.Header{Typeflag: tar.TypeReg, Name: "./usr/share/java/junit4.jar", Mode: 0o644, ModTime: oldTime}, "PK junit"},
		{tar.Header{Typeflag: tar.TypeReg, Name: "./usr/share/java/hamcrest.jar", Mode: 0o644, ModTime: oldTime}, "PK hamcrest"},
		{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./usr/share/maven-repo/junit/junit/", Mode: 0o755, ModTime: oldTime}},
		{tar.Header{Typeflag: tar.TypeReg, Name: "./usr/bin/su", Mode: 0o4755, ModTime: oldTime}, "su"},
		{tar.Header{Typeflag: tar.TypeReg, Name: "./" + PackagesPath, Mode: 0o644, ModTime: futureTime},
			"gradle\t4.4.1-18\njunit4\t4.13.2-3\nlibc6:amd64\t2.36-9+deb12u13\nopenjdk-17-jdk-headless:amd64\t17.0.19+10-1~deb12u2\n"},
	}
	members = slices.DeleteFunc(members, func(m tarMember) bool { return strings.TrimSuffix(m.hdr.Name, "/") == "./"+leaveOut })
	return writeTar(t, t.TempDir(), members)
}

func buildBuilderGradle(t *testing.T, base string) (v1.Image, Result) {
	t.Helper()
	out := t.TempDir()
	img, err := BuilderGradleImage(BuilderGradle{Base: base}, testMeta, filepath.Join(out, "work"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Write(img, BuilderGradleName, testMeta.Version, out)
	if err != nil {
		t.Fatal(err)
	}
	return layoutImage(t, r), r
}

// imageMembers reads every layer of img: the last header of each path.
func imageMembers(t *testing.T, img v1.Image) map[string]tar.Header {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	members := map[string]tar.Header{}
	for _, l := range layers {
		hs, _ := layerMembers(t, l)
		checkNormalized(t, hs)
		for _, h := range hs {
			members[strings.TrimSuffix(h.Name, "/")] = h
		}
	}
	return members
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func TestBuilderGradleImage(t *testing.T) {
	base := fakeBuilderBase(t, "")
	img, a := buildBuilderGradle(t, base)
	_, b := buildBuilderGradle(t, base)
	if a.Digest != b.Digest {
		t.Errorf("two builds of the same inputs: digests %s and %s, want equal", a.Digest, b.Digest)
	}
	if !strings.HasPrefix(a.Line(), "image talkide-builder-gradle@sha256:") {
		t.Errorf("result line %q", a.Line())
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if len(c.Entrypoint) != 0 || len(c.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want neither: the Job gives the command", c.Entrypoint, c.Cmd)
	}
	if c.User != "65532:65532" || c.WorkingDir != "/workspace" {
		t.Errorf("user %q working dir %q, want 65532:65532 and /workspace", c.User, c.WorkingDir)
	}
	env := envMap(c.Env)
	for k, want := range map[string]string{"JAVA_HOME": "/usr/lib/jvm/java-17-openjdk-amd64", "GRADLE_USER_HOME": "/gradle-home",
		"HOME": "/gradle-home", "LANG": "C.UTF-8", "JAVA_TOOL_OPTIONS": "-Duser.home=/gradle-home"} {
		if env[k] != want {
			t.Errorf("env %s=%q, want %q", k, env[k], want)
		}
	}
	if !slices.Contains(strings.Split(env["PATH"], ":"), "/usr/bin") {
		t.Errorf("PATH %q, want /usr/bin (gradle) on it", env["PATH"])
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.title": "talkide-builder-gradle", "org.opencontainers.image.revision": "0123abcd",
		"org.opencontainers.image.version": "v0-test", "org.opencontainers.image.source": "https://github.com/talkide/talkide",
		"org.opencontainers.image.created": "2025-10-09T08:53:20Z", LabelRequires: BuilderGradleRequires,
		"dev.talkide.gradle.version": "4.4.1-18", "dev.talkide.jdk.version": "17.0.19+10-1~deb12u2", "dev.talkide.junit.version": "4.13.2-3",
	} {
		if c.Labels[k] != want {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], want)
		}
	}
	if c.Labels["org.opencontainers.image.description"] == "" {
		t.Error("no description label")
	}
	if !cf.Created.Time.Equal(epoch) || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("created %v os %s arch %s", cf.Created, cf.OS, cf.Architecture)
	}
	layers, _ := img.Layers()
	if len(layers) != 2 {
		t.Errorf("%d layers, want 2 (Debian base, directories)", len(layers))
	}
	members := imageMembers(t, img)
	for _, d := range []string{"tmp", "workspace", "gradle-home"} {
		if h := members[d]; h.Typeflag != tar.TypeDir || h.Mode != 0o1777 || h.Uid != 0 {
			t.Errorf("/%s: type %q mode %o uid %d, want a directory 1777 of root (any uid writes there)", d, h.Typeflag, h.Mode, h.Uid)
		}
	}
	if h := members["usr/bin/su"]; h.Mode != 0o755 {
		t.Errorf("usr/bin/su mode %o, want 0755: no setuid", h.Mode)
	}

	for _, missing := range []string{"usr/bin/gradle", "usr/lib/jvm/java-17-openjdk-amd64/bin/javac", "usr/share/java/junit4.jar", "usr/share/java/hamcrest.jar"} {
		_, err := BuilderGradleImage(BuilderGradle{Base: fakeBuilderBase(t, missing)}, testMeta, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("a base without %s: error %v, want one naming it", missing, err)
		}
	}
}

// resolve follows the symbolic links of p (absolute) through the image's
// members, as the kernel would, and returns the member it names.
func resolve(members map[string]tar.Header, p string) (tar.Header, bool) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	for hops := 0; hops < 40; hops++ {
		done := true
		for i := range parts {
			cur := strings.Join(parts[:i+1], "/")
			h, ok := members[cur]
			if !ok && i < len(parts)-1 {
				continue // a directory a layer made implicitly
			}
			if !ok {
				return tar.Header{}, false
			}
			if h.Typeflag != tar.TypeSymlink {
				continue
			}
			target := h.Linkname
			if !strings.HasPrefix(target, "/") {
				target = path.Join(path.Dir("/"+cur), target)
			}
			parts = append(strings.Split(strings.Trim(path.Clean(target), "/"), "/"), parts[i+1:]...)
			done = false
			break
		}
		if done {
			return members[strings.Join(parts, "/")], true
		}
	}
	return tar.Header{}, false
}

// TestBuilderGradleImageFitsTheGradleJob checks the image against the Job
// internal/worker/buildjob makes of it: its command (/bin/sh, which removes the
// earlier reports with rm and becomes gradle) is in the image and gradle
// on its PATH, its working directory and every writable mount are
// directories any uid may write to, and the Gradle home the Job sets is the
// image's own.
func TestBuilderGradleImageFitsTheGradleJob(t *testing.T) {
	img, r := buildBuilderGradle(t, fakeBuilderBase(t, ""))
	g := buildjob.GradleJobBuilder{Base: buildjob.Base{Image: "registry.example/talkide-builder-gradle@" + r.Digest.String()}}
	job, err := g.Job(buildjob.GradleRequest{Request: buildjob.Request{Tenant: "acme", Env: "dev", Conversation: "c1", ID: "b1", RunAsUser: 12345},
		Tasks: []string{"test"}})
	if err != nil {
		t.Fatal(err)
	}
	ctr := job.Spec.Template.Spec.Containers[0]
	cf, _ := img.ConfigFile()
	env := envMap(cf.Config.Env)
	members := imageMembers(t, img)
	if h, ok := resolve(members, ctr.Command[0]); !ok || h.Typeflag != tar.TypeReg || h.Mode&0o111 == 0 {
		t.Errorf("the Job runs %s, which is no program in the image (%+v)", ctr.Command[0], h)
	}
	cmdline := append(slices.Clone(ctr.Command), ctr.Args...)
	for _, prog := range []string{"gradle", "rm"} {
		if !strings.Contains(strings.Join(cmdline, " "), prog) {
			continue
		}
		found := false
		for _, dir := range strings.Split(env["PATH"], ":") {
			if h, ok := resolve(members, dir+"/"+prog); ok && h.Typeflag == tar.TypeReg && h.Mode&0o111 != 0 {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("the Job runs %q: %s is not on the image's PATH %s", cmdline, prog, env["PATH"])
		}
	}
	if ctr.WorkingDir != cf.Config.WorkingDir {
		t.Errorf("the Job works in %s, the image in %s", ctr.WorkingDir, cf.Config.WorkingDir)
	}
	for _, m := range ctr.VolumeMounts {
		if m.ReadOnly {
			continue
		}
		if h := members[strings.TrimPrefix(m.MountPath, "/")]; h.Typeflag != tar.TypeDir || h.Mode != 0o1777 {
			t.Errorf("the Job mounts %s writable; in the image it is type %q mode %o, want a directory 1777", m.MountPath, h.Typeflag, h.Mode)
		}
	}
	for _, e := range ctr.Env {
		if v, ok := env[e.Name]; ok && v != e.Value && e.Name != "PATH" {
			t.Errorf("the Job sets %s=%s, the image %s", e.Name, e.Value, v)
		}
		if e.Name == "GRADLE_USER_HOME" && e.Value != BuilderGradleHome {
			t.Errorf("the Job's GRADLE_USER_HOME %s, the image's %s", e.Value, BuilderGradleHome)
		}
	}
	if job.Spec.Template.Spec.SecurityContext.RunAsUser == nil || *job.Spec.Template.Spec.SecurityContext.RunAsUser != 12345 {
		t.Errorf("the Job runs as %v, want the agent's uid", job.Spec.Template.Spec.SecurityContext.RunAsUser)
	}
}

// builtBuilderGradle returns the builder image `make images` built (its
// line in .cache/images/images.txt) and its OCI layout; make test builds it first.
func builtBuilderGradle(t *testing.T) (v1.Image, string) {
	t.Helper()
	list, err := os.ReadFile(filepath.Join(moduleRoot(), ".cache/images/images.txt"))
	if err != nil {
		t.Fatal("no images built: make images builds them (make test does first; the builder's Debian base with debootstrap, as root)")
	}
	for line := range strings.Lines(string(list)) {
		f := strings.Fields(line)
		if len(f) != 3 || !strings.HasPrefix(f[1], BuilderGradleName+"@") {
			continue
		}
		d, err := v1.NewHash(strings.TrimPrefix(f[1], BuilderGradleName+"@"))
		if err != nil {
			t.Fatalf("images.txt: %q: %v", line, err)
		}
		return layoutImage(t, Result{Digest: d, Layout: f[2]}), f[2]
	}
	t.Fatal("make images built no " + BuilderGradleName + " (images.txt is older): run it again")
	return nil, ""
}

// TestBuilderGradleImageRunsAGradleBuild runs, in the builder image make
// images built (on the real Debian base), what a build Job runs (the
// command, arguments, environment and working directory of the Job
// GradleJobBuilder makes: the earlier reports removed, then `gradle
// --no-daemon --console=plain --offline test`) on a small project with
// JUnit 4 tests, as a uid with no passwd entry, with the root filesystem
// read-only, /tmp a tmpfs, and the working tree and the Gradle home
// mounted, as in a Job with readOnlyRootFilesystem. It checks that the
// project resolves JUnit and Hamcrest from Debian's Maven repository
// offline, that javac reads UTF-8 sources, every JVM's user.home, no
// setuid or setgid file, and the JUnit report where buildjob.ReadResults
// looks for it. It needs root (chroot, mounts in a mount namespace of its
// own, gone when the command ends).
func TestBuilderGradleImageRunsAGradleBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: unpacks a 500 MB image and runs Gradle")
	}
	img, layout := builtBuilderGradle(t)
	if os.Geteuid() != 0 {
		t.Fatal("not root: cannot chroot into the image to run Gradle (make test runs as root)")
	}
	for _, tool := range []string{"unshare", "tar", "mount", "chroot", "chown"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("no %s", tool)
		}
	}
	dir := t.TempDir()
	rootfs, ws, home := filepath.Join(dir, "rootfs"), filepath.Join(dir, "workspace"), filepath.Join(dir, "gradle-home")
	for _, d := range []string{rootfs, ws, home} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Unpacked from the layout's blobs by tar and gzip, not through Go's
	// decompressor: a few seconds instead of a minute under -race.
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, l := range m.Layers {
		blob := filepath.Join(layout, "blobs", l.Digest.Algorithm, l.Digest.Hex)
		if out, err := exec.Command("tar", "-x", "-z", "-p", "--numeric-owner", "-f", blob, "-C", rootfs).CombinedOutput(); err != nil {
			t.Fatalf("unpack layer %s: %v\n%s", l.Digest, err, out)
		}
	}
	t.Logf("unpacked in %s", time.Since(start).Round(time.Millisecond))
	err = filepath.WalkDir(rootfs, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if fi, err := d.Info(); err == nil && fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("%s: mode %v, want no setuid or setgid bit", strings.TrimPrefix(p, rootfs), fi.Mode())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "usr/lib/locale/C.utf8/LC_CTYPE")); err != nil {
		t.Errorf("no C.UTF-8 locale, which LANG names: %v", err)
	}

	const uid = "4321"
	files := map[string]string{
		"settings.gradle": "rootProject.name = 'hello'\n",
		"build.gradle": `apply plugin: 'java'
repositories { maven { url 'file:///usr/share/maven-repo' } }
dependencies { testCompile 'junit:junit:4.x' }
`,
		"src/main/java/hello/Greeter.java": "package hello;\n\npublic class Greeter {\n\tpublic static String greet(String name) { return \"Grüß dich, \" + name; }\n}\n",
		"src/test/java/hello/GreeterTest.java": `package hello;

import static org.hamcrest.CoreMatchers.startsWith;
import static org.hamcrest.MatcherAssert.assertThat;
import static org.junit.Assert.assertEquals;

import org.junit.Test;

public class GreeterTest {
	@Test public void greets() { assertThat(Greeter.greet("Zoë"), startsWith("Grüß")); }
	@Test public void utf8() { assertEquals(14, Greeter.greet("Zoë").length()); }
	@Test public void home() { assertEquals("/gradle-home", System.getProperty("user.home")); }
}
`,
	}
	for name, data := range files {
		p := filepath.Join(ws, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("chown", "-R", uid+":"+uid, ws, home).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v\n%s", err, out)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	// What the Job runs, with its environment over the image's.
	d, _ := img.Digest()
	g := buildjob.GradleJobBuilder{Base: buildjob.Base{Image: "registry.example/talkide-builder-gradle@" + d.String()}}
	job, err := g.Job(buildjob.GradleRequest{Request: buildjob.Request{Tenant: "acme", Env: "dev", Conversation: "c1", ID: "b1", RunAsUser: 4321},
		Tasks: []string{"test"}, Offline: true})
	if err != nil {
		t.Fatal(err)
	}
	ctr := job.Spec.Template.Spec.Containers[0]
	env := slices.Clone(cf.Config.Env)
	for _, e := range ctr.Env {
		env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, e.Name+"=") })
		env = append(env, e.Name+"="+e.Value)
	}
	// A stale report the Job's command must remove first.
	stale := filepath.Join(ws, buildjob.ReportsDir, "test", "TEST-hello.OldTest.xml")
	if err := os.MkdirAll(filepath.Dir(stale), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, []byte("<testsuite/>"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("chown", "-R", uid+":"+uid, ws).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v\n%s", err, out)
	}
	// The image read-only, as a Job's readOnlyRootFilesystem makes it,
	// and writable what the Job mounts: in a mount (and PID) namespace of
	// its own, so every mount goes with the command.
	script := `set -e
r=$1; shift
mount --bind "$r" "$r"; mount -o remount,bind,ro "$r"
mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"
mount --bind "$WS" "$r/workspace"; mount --bind "$GH" "$r/gradle-home"
mount -t proc proc "$r/proc"
mount --bind /dev "$r/dev"
exec chroot --userspec=` + uid + ":" + uid + ` "$r" "$@"`
	args := []string{"--mount", "--pid", "--fork", "sh", "-c", script, "sh", rootfs, "/usr/bin/env", "-i", "-C", ctr.WorkingDir}
	args = append(args, env...)
	args = append(append(args, ctr.Command...), ctr.Args...)
	if !slices.Contains(ctr.Args, "--offline") {
		t.Errorf("the Job's arguments %q: want --offline", ctr.Args)
	}
	cmd := exec.Command("unshare", args...)
	cmd.Env = append(os.Environ(), "WS="+ws, "GH="+home)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start = time.Now()
	err = cmd.Run()
	t.Logf("gradle test in the image: %s", time.Since(start).Round(time.Second))
	if err != nil {
		t.Fatalf("gradle test in the image: %v\n%s", err, out.String())
	}
	report, err := os.ReadFile(filepath.Join(ws, buildjob.ReportsDir, "test", "TEST-hello.GreeterTest.xml"))
	if err != nil {
		t.Fatalf("no JUnit report: %v\n%s", err, out.String())
	}
	var suite struct {
		Tests    int `xml:"tests,attr"`
		Failures int `xml:"failures,attr"`
		Errors   int `xml:"errors,attr"`
	}
	if err := xml.Unmarshal(report, &suite); err != nil {
		t.Fatal(err)
	}
	if suite.Tests != 3 || suite.Failures+suite.Errors != 0 {
		t.Errorf("JUnit report: %d tests, %d failures, %d errors; want 3 passing\n%s\n%s", suite.Tests, suite.Failures, suite.Errors, report, out.String())
	}
	if _, err := os.Stat(stale); err == nil {
		t.Error("the report of an earlier build is still there: the Job's command did not remove it")
	}
	if _, err := os.Stat(filepath.Join(ws, "?")); err == nil {
		t.Error(`the build made a directory "?" in the working tree: a JVM's user.home was not the Gradle home`)
	}
}
