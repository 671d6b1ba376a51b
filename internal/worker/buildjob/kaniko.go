package buildjob

import (
	"errors"
	"fmt"
	"path"
	"regexp"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// KanikoJobBuilder makes the Jobs that build an image from a Dockerfile in
// the working tree with Kaniko, without a daemon. The original Kaniko
// project was archived in 2025: use a maintained fork's executor image
// (for example osscontainertools/kaniko), pinned by digest in Base.Image.
// Kaniko unpacks the base image's layers as root, so its Job runs as root
// in a user namespace of the pod's own (hostUsers: false), with only the
// file-owner capabilities of Pod Security's baseline.
type KanikoJobBuilder struct {
	Base
}

// KanikoRequest is one image build.
type KanikoRequest struct {
	Request
	// Context is the build context, a directory of the working tree
	// ("." for its root).
	Context string
	// Dockerfile is the Dockerfile's path within Context. Default
	// "Dockerfile".
	Dockerfile string
	// Destination is where the image is pushed (registry/repo:tag); empty:
	// built but not pushed (--no-push), the image written as a tarball
	// beside the context, image.tar.
	Destination string
}

var destination = regexp.MustCompile(`^[a-z0-9][-a-z0-9._/:@]*$`)

// cleanRel reports whether p is a relative path that stays inside its root.
func cleanRel(p string) bool {
	c := path.Clean(p)
	return p != "" && !path.IsAbs(p) && c != ".." && !(len(c) > 2 && c[:3] == "../")
}

// Job returns the Job of r.
func (k *KanikoJobBuilder) Job(r KanikoRequest) (*batchv1.Job, error) {
	if r.Dockerfile == "" {
		r.Dockerfile = "Dockerfile"
	}
	var errs []error
	if !cleanRel(r.Context) {
		errs = append(errs, fmt.Errorf("kaniko context %q: want a directory of the working tree", r.Context))
	}
	if !cleanRel(r.Dockerfile) {
		errs = append(errs, fmt.Errorf("kaniko dockerfile %q: want a path within the context", r.Dockerfile))
	}
	if r.Destination != "" && !destination.MatchString(r.Destination) {
		errs = append(errs, fmt.Errorf("kaniko destination %q: want registry/repository:tag", r.Destination))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	ctx := path.Join(WorkspaceMount, path.Clean(r.Context))
	args := []string{"--context=dir://" + ctx, "--dockerfile=" + path.Join(ctx, path.Clean(r.Dockerfile))}
	if r.Destination != "" {
		args = append(args, "--destination="+r.Destination)
	} else {
		args = append(args, "--no-push", "--tar-path="+path.Join(ctx, "image.tar"))
	}
	c := corev1.Container{Name: "kaniko", Args: args}
	return k.job(r.Request, KindKaniko, c, nil, true)
}
