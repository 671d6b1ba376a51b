package worker

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/talkide/talkide/internal/worker/sessionstore"
)

const testBuildImage = "registry.example/talkide-builder-gradle@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// Where a worker's builds run follows its configuration; a mode that
// cannot work here leaves the tool offered, saying why, and a wrong
// configuration is an error at start.
func TestBuildModes(t *testing.T) {
	store, err := sessionstore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	kube := func() (kubernetes.Interface, string, error) { return fake.NewSimpleClientset(), "acme-dev", nil }
	noKube := func() (kubernetes.Interface, string, error) { return nil, "", errors.New("no in-cluster credentials") }
	for _, c := range []struct {
		name       string
		bc         BuildConfig
		kube       func() (kubernetes.Interface, string, error)
		runner     string
		why, fails string
		inPod      bool
	}{
		{name: "an image: Jobs", bc: BuildConfig{Image: testBuildImage}, kube: kube, runner: "kubernetes"},
		{name: "no credentials", bc: BuildConfig{Image: testBuildImage}, kube: noKube, why: "no Kubernetes credentials"},
		{name: "a tag", bc: BuildConfig{Mode: BuildsKubernetes, Image: "gradle:8"}, kube: kube, fails: "pinned by digest"},
		{name: "a node by name", bc: BuildConfig{Image: testBuildImage, NodeSelector: map[string]string{"kubernetes.io/hostname": "n1"}}, kube: kube, fails: "by name"},
		{name: "no gradle", bc: BuildConfig{Gradle: "/nonexistent/gradle"}, kube: noKube, why: "apt-get install gradle junit4"},
		{name: "off", bc: BuildConfig{Mode: BuildsOff}, kube: kube, why: "turned builds off"},
		{name: "a pod without an image", bc: BuildConfig{}, kube: kube, inPod: true, why: "no builder image"},
		{name: "unknown", bc: BuildConfig{Mode: "docker"}, kube: kube, fails: "want kubernetes, local or off"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.inPod {
				t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
			} else {
				t.Setenv("KUBERNETES_SERVICE_HOST", "")
			}
			cfg := Config{Tenant: "acme", Env: "dev", SessionDir: t.TempDir(), Builds: c.bc}
			b, err := newBuilds(cfg, store, nil, c.kube, slog.Default())
			if c.fails != "" {
				if err == nil || !strings.Contains(err.Error(), c.fails) {
					t.Fatalf("%v; want an error saying %q", err, c.fails)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			runner, why := b.server.Runner()
			if runner != c.runner || !strings.Contains(why, c.why) || (c.runner == "kubernetes") != (b.jobs != nil) {
				t.Errorf("runner %q (jobs %v), unavailable %q; want %q, %q", runner, b.jobs != nil, why, c.runner, c.why)
			}
		})
	}
}

func TestParseTolerations(t *testing.T) {
	tol, err := ParseTolerations("pool=builds:NoSchedule, spot:NoExecute")
	if err != nil || len(tol) != 2 || tol[0].Key != "pool" || tol[0].Value != "builds" || tol[0].Operator != "Equal" ||
		tol[1].Key != "spot" || tol[1].Operator != "Exists" || tol[1].Effect != "NoExecute" {
		t.Errorf("%+v %v", tol, err)
	}
	if _, err := ParseTolerations("pool=builds:Sometimes"); err == nil {
		t.Error("an unknown effect was taken")
	}
	sel, err := ParseSelector("pool=builds,zone=a")
	if err != nil || sel["pool"] != "builds" || sel["zone"] != "a" {
		t.Errorf("%v %v", sel, err)
	}
	if _, err := ParseSelector("pool"); err == nil {
		t.Error("a selector without a value was taken")
	}
}
