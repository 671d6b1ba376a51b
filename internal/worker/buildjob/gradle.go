package buildjob

import (
	"regexp"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// GradleJobBuilder makes the Jobs of Gradle builds and tests.
//
// The Gradle cache (DESIGN open point 2): Gradle's cache locks are
// released over loopback, which does not cross pods, so concurrent builds
// must never share a writable cache. Each Job gets its own writable Gradle
// home (an emptyDir, GRADLE_USER_HOME), which ends with the Job, and no
// shared cache: the builder's Gradle (Debian bookworm's, 4.4.1, the only
// one it packages) predates Gradle's read-only dependency cache
// (GRADLE_RO_DEP_CACHE, Gradle 6.2). An offline build (--offline, as
// KubeRunner asks) resolves its dependencies from the project (jars or a
// file repository in the working tree) or from the image (Debian's Maven
// repository, /usr/share/maven-repo, and /usr/share/java: JUnit 4 and
// Hamcrest; docs/images.md).
type GradleJobBuilder struct {
	Base
}

// GradleRequest is one Gradle build.
type GradleRequest struct {
	Request
	// Tasks are the Gradle tasks, e.g. ["build"] or ["test"].
	Tasks []string
	// Tests filters the test task (`--tests`), e.g. "com.acme.FooTest";
	// empty: every test.
	Tests string
	// Offline adds --offline.
	Offline bool
}

var (
	gradleTask = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_:-]{0,127}$`)
	// A filter never starts with "-": it follows --tests as an argument
	// of its own, and Gradle would read "--init-script" there as an option.
	gradleFilter = regexp.MustCompile(`^[A-Za-z0-9_.$*#][A-Za-z0-9_.$*#-]{0,255}$`)
)

// ReportsDir is where a Gradle build leaves its JUnit XML, relative to the
// working tree (Gradle's default for the test task).
const ReportsDir = "build/test-results"

// Job returns the Job of r. Tasks and the test filter are plain names:
// never options, so a request cannot add an init script or a property.
func (g *GradleJobBuilder) Job(r GradleRequest) (*batchv1.Job, error) {
	args, err := Spec{Tasks: r.Tasks, Tests: r.Tests}.gradleArgs(r.Offline)
	if err != nil {
		return nil, err
	}
	c := corev1.Container{
		// As the local runner: the reports of earlier builds go first (as
		// the build's user), so the results are this build's.
		Name: "gradle", Command: []string{"/bin/sh", "-c", cleanAndRun, "gradle"}, Args: args,
		Env:          []corev1.EnvVar{{Name: "GRADLE_USER_HOME", Value: "/gradle-home"}, {Name: "HOME", Value: "/gradle-home"}},
		VolumeMounts: []corev1.VolumeMount{{Name: "gradle-home", MountPath: "/gradle-home"}},
	}
	vols := []corev1.Volume{{Name: "gradle-home", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	// The root file system is read-only: what a build writes goes to the
	// working tree, its Gradle home or /tmp (an emptyDir).
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"})
	vols = append(vols, corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	job, err := g.job(r.Request, KindGradle, c, vols, false)
	if err != nil {
		return nil, err
	}
	job.Spec.Template.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem = ptr.To(true)
	return job, nil
}

// gradleArgs are the arguments of the gradle command of s, for every
// runner: no daemon (a build is one process tree that ends with it), plain
// console output (lines, for the log), --offline when offline, the tasks,
// and --tests with the filter (a task option: it applies to the task
// before it, so a filter goes with a test task last). Tasks and the filter
// must be plain names (gradleTask, gradleFilter), never options: a request
// cannot add an init script, a property or another build file. The error
// names every refused part.
func (s Spec) gradleArgs(offline bool) ([]string, error) {
	if err := ValidateSpec(s); err != nil {
		return nil, err
	}
	args := []string{"--no-daemon", "--console=plain"}
	if offline {
		args = append(args, "--offline")
	}
	args = append(args, s.Tasks...)
	if s.Tests != "" {
		args = append(args, "--tests", s.Tests)
	}
	return args, nil
}
