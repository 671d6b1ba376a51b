// Package imagebuild builds TalkIDE's three OCI images without a container
// daemon and reproducibly: talkide-controlplane (the static control-plane
// binary on a minimal base of a few files), talkide-worker (the worker
// binary and the pinned Claude Code CLI on a Debian base made with
// debootstrap) and talkide-builder-gradle (Debian's Gradle, OpenJDK 17 and
// JUnit 4 on a Debian base of its own: the image of the Gradle build Jobs
// of internal/worker/buildjob). `make images` (scripts/images) drives it.
//
// Main parts:
//   - Base makes the Debian root filesystem with debootstrap and caches it as
//     a tarball under <out>/base/<key>/, key = hash of suite, mirror and
//     package list (and this package's recipe version).
//   - ControlPlaneImage, WorkerImage and BuilderGradleImage assemble an
//     image from files on disk (binaries, the CLI's directory, the base
//     tarballs).
//   - Write stores an image as an OCI image layout at <out>/oci/<name>/ and as
//     a tarball <out>/<name>.tar, and returns the digest.
//
// Reproducible: every layer is written by this package from entries sorted
// by name, with numeric owners and no owner names, modification times
// clamped to Meta.Created (SOURCE_DATE_EPOCH) and a fixed gzip setting, and
// the config's created time is that same instant; BuildGoBinary builds with
// no VCS stamp and a Go environment of its own (goBuildEnv), not the
// builder's; so the same inputs (commit, Go toolchain, cached base) give the
// same digests. The rest (manifests, config, layout, tarball) is
// go-containerregistry's. ko is not used: it would build the Go binaries
// itself but gives no control over a Debian base's layer, which this needs.
//
// It is not a general image builder: the images' contents are fixed here,
// and it only writes to disk (pushing is crane's job, see docs/images.md).
package imagebuild
