package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/pgtest"
	"github.com/talkide/talkide/internal/testlane"
	"github.com/talkide/talkide/internal/token"
)

// The chart (deploy/helm/talkide) is checked here, beside the binary it
// deploys: linted and rendered by the pinned Helm 4 and Helm 3 with default
// and non-default values, every rendered object dry-run applied to the test
// cluster, and installed and upgraded there with the images `make images`
// built, the control plane then running as this binary with the installed
// Deployment's environment and its ServiceAccount's token.

const chartRel = "deploy/helm/talkide"

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// helmBins returns the pinned Helm binaries of deploy/versions.env by
// major version ("4", "3"), as `make helm` builds them.
func helmBins(t *testing.T) map[string]string {
	t.Helper()
	testlane.NeedsHelm(t)
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "deploy/versions.env"))
	if err != nil {
		t.Fatal(err)
	}
	bins := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok || strings.HasPrefix(name, "#") || !strings.HasPrefix(name, "HELM") {
			continue
		}
		bin := filepath.Join(root, ".cache/tools/helm-"+v, "helm")
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("helm %s is not built (%v): run `make helm` (make test does)", v, err)
		}
		bins[strings.TrimPrefix(strings.SplitN(v, ".", 2)[0], "v")] = bin
	}
	if bins["4"] == "" || bins["3"] == "" {
		t.Fatalf("deploy/versions.env pins %v; want a Helm 4 and a Helm 3", bins)
	}
	return bins
}

// helm runs a Helm binary with KUBECONFIG and Helm's own state in t's
// temporary directories.
func helm(t *testing.T, bin, kubeconfig string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "HELM_CACHE_HOME="+home+"/cache",
		"HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// builtImage is one line of `make images`: image NAME@sha256:DIGEST PATH.
type builtImage struct{ Name, Digest, Ref, Layout string }

// builtImages reads the lines `make images` printed (and kept in
// .cache/images/images.txt).
func builtImages(t *testing.T) map[string]builtImage {
	t.Helper()
	path := filepath.Join(repoRoot(t), ".cache/images/images.txt")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the images are not built (%v): run `make images` (make test does)", err)
	}
	imgs := map[string]builtImage{}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "image" {
			t.Fatalf("%s: line %q is not `image NAME@sha256:DIGEST PATH`", path, line)
		}
		name, digest, ok := strings.Cut(f[1], "@")
		if !ok || !strings.HasPrefix(digest, "sha256:") || len(digest) != len("sha256:")+64 {
			t.Fatalf("%s: %q is not NAME@sha256:DIGEST", path, f[1])
		}
		if _, err := os.Stat(filepath.Join(f[2], "index.json")); err != nil {
			t.Fatalf("%s: %s is not an OCI layout: %v", path, f[2], err)
		}
		imgs[name] = builtImage{Name: name, Digest: digest, Ref: f[1], Layout: f[2]}
	}
	for _, n := range []string{"talkide-controlplane", "talkide-worker", "talkide-builder-gradle"} {
		if imgs[n].Ref == "" {
			t.Fatalf("%s names no image %s", path, n)
		}
	}
	return imgs
}

// objects splits rendered YAML into objects.
func objects(t *testing.T, rendered string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for doc := range strings.SplitSeq(rendered, "\n---") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func convert[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	if o == nil {
		t.Fatalf("no %T rendered", *new(T))
	}
	v := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, v, true); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return v
}

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

// The chart carries exactly what `talkide-controlplane clusterrole` prints:
// the ClusterRole is written once, in the code.
func TestChartCarriesTheClusterPolicies(t *testing.T) {
	var out bytes.Buffer
	if err := printClusterRole(&out); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(repoRoot(t), chartRel, "files/cluster-policies.yaml")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, out.Bytes()) {
		t.Fatalf("%s differs from `talkide-controlplane clusterrole`; regenerate it: go generate ./cmd/talkide-controlplane", file)
	}
}

// helm lint and helm template, Helm 4 and Helm 3, default and non-default
// values: both Helms render the same objects, every one of which the test
// cluster accepts (server-side dry run), and the objects say what the
// values asked for.
func TestChartLintTemplateDryRun(t *testing.T) {
	bins := helmBins(t)
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	chart := filepath.Join(repoRoot(t), chartRel)
	full := filepath.Join(chart, "ci/full-values.yaml")
	for _, values := range []string{"", full} {
		var vargs []string
		name := "default values"
		if values != "" {
			vargs, name = []string{"-f", values}, "ci/full-values.yaml"
		}
		t.Run(name, func(t *testing.T) {
			rendered := map[string]string{}
			for major, bin := range bins {
				// Rendered for the test cluster's version (Helm 3 assumes
				// 1.20 offline, below the chart's kubeVersion).
				kv := []string{"--kube-version", kubetest.Pinned().Kubernetes}
				if out, err := helm(t, bin, c.Kubeconfig(), slices.Concat([]string{"lint", "--strict", chart}, kv, vargs)...); err != nil {
					t.Fatalf("helm %s lint: %v\n%s", major, err, out)
				}
				out, err := helm(t, bin, c.Kubeconfig(), slices.Concat([]string{"template", "talkide", chart, "-n", ns}, kv, vargs)...)
				if err != nil {
					t.Fatalf("helm %s template: %v", major, err)
				}
				rendered[major] = out
			}
			o4, o3 := objects(t, rendered["4"]), objects(t, rendered["3"])
			if !reflect.DeepEqual(o4, o3) {
				t.Errorf("Helm 4 and Helm 3 render different objects:\n--- helm 4\n%s\n--- helm 3\n%s", rendered["4"], rendered["3"])
			}
			dryRunApply(t, newDynClient(t, c), ns, o4)
			if values == "" {
				checkDefaultRender(t, o4)
			} else {
				checkFullRender(t, o4)
			}
		})
	}

	// A bad or hostile value fails rendering (values.schema.json) with a
	// message naming it, before anything reaches the cluster: no YAML
	// injected through a scalar, no extra worker setting smuggled in
	// through a comma.
	for _, bad := range []struct{ set, names string }{
		{"worker.image.digest=latest", "/worker/image/digest"},
		{"image.digest=sha256:zz", "/image/digest"},
		{"image.pullPolicy=IfNotPresent\n          stdin: true", "/image/pullPolicy"},
		{"worker.env.TALKIDE_MAX_PROCESSES=8\\,TALKIDE_CONTAINMENT=weak", "/worker/env/TALKIDE_MAX_PROCESSES"},
		{"worker.env.LD_PRELOAD=/tmp/x.so", "invalid propertyName 'LD_PRELOAD'"},
		{"installation=a'b", "/installation"},
		{"ingress.paths[0].path=/x\n    evil: 1", "/ingress/paths/0/path"},
		{"service.type=ExternalName", "/service/type"},
		{"replicaCount=two", "/replicaCount"},
		{"secret.name=x\n  y: z", "/secret/name"},
		{"worker.egressCIDRs[0]=0.0.0.0/0\n  - 1", "/worker/egressCIDRs/0"},
		{"podDisruptionBudget.minAvailable=1\n---\nkind: ClusterRoleBinding", "minAvailable"},
		{"extraEnv[0].name=TALKIDE_CONFIG_REVISION", "extraEnv"},
		{"extraEnv[0].name=TALKIDE_WORKER_BUILD_IMAGE", "extraEnv"},
		{"builds.gradleImage.digest=latest", "/builds/gradleImage/digest"},
		// A build image is pinned by digest: a repository alone is refused,
		// and so is a digest without its repository.
		{"builds.gradleImage.repository=registry.example/talkide-builder-gradle", "/builds/gradleImage"},
		{"builds.gradleImage.digest=sha256:" + strings.Repeat("0", 64), "/builds/gradleImage"},
		{"builds.gradleImage.tag=1.0", "/builds/gradleImage"},
	} {
		for major, bin := range bins {
			out, err := helm(t, bin, c.Kubeconfig(), "template", "talkide", chart, "--kube-version", kubetest.Pinned().Kubernetes, "--set-string", bad.set)
			if bad.set == "replicaCount=two" {
				out, err = helm(t, bin, c.Kubeconfig(), "template", "talkide", chart, "--kube-version", kubetest.Pinned().Kubernetes, "--set", bad.set)
			}
			if err == nil || !strings.Contains(err.Error(), bad.names) {
				t.Errorf("helm %s template --set %q: %v; want a refusal naming %s\n%s", major, bad.set, err, bad.names, out)
			}
		}
	}
}

func checkDefaultRender(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind()+"/"+o.GetName())
		if o.GetKind() == "Secret" {
			t.Errorf("the chart renders a Secret %s: secrets are the operator's (docs/deploying.md)", o.GetName())
		}
	}
	for _, want := range []string{"ServiceAccount/talkide-controlplane", "Service/talkide-controlplane", "Deployment/talkide-controlplane",
		"PodDisruptionBudget/talkide-controlplane", "NetworkPolicy/talkide-controlplane", "ClusterRole/talkide-controlplane",
		"ValidatingAdmissionPolicy/" + provision.ScopePolicyName, "ValidatingAdmissionPolicy/" + provision.JobPolicyName,
		"ValidatingAdmissionPolicyBinding/" + provision.ScopePolicyName, "ValidatingAdmissionPolicyBinding/" + provision.JobPolicyName} {
		if !slices.Contains(kinds, want) {
			t.Errorf("default values render no %s (rendered %v)", want, kinds)
		}
	}
	if slices.ContainsFunc(kinds, func(k string) bool { return strings.HasPrefix(k, "Ingress/") }) {
		t.Error("an Ingress by default")
	}
	cr := convert[rbacv1.ClusterRole](t, find(objs, "ClusterRole", provision.ClusterRoleName))
	if !reflect.DeepEqual(cr.Rules, provision.ClusterRole().Rules) {
		t.Errorf("the chart's ClusterRole is not the provisioner's:\n%+v", cr.Rules)
	}
	for _, o := range objs {
		if o.GetKind() == "ClusterRoleBinding" {
			crb := convert[rbacv1.ClusterRoleBinding](t, o)
			if crb.RoleRef.Name != provision.ClusterRoleName || len(crb.Subjects) != 1 || crb.Subjects[0].Name != provision.ControlPlaneServiceAccount {
				t.Errorf("ClusterRoleBinding %s binds %+v to %+v", crb.Name, crb.RoleRef, crb.Subjects)
			}
		}
	}
	d := convert[appsv1.Deployment](t, find(objs, "Deployment", "talkide-controlplane"))
	if *d.Spec.Replicas != 2 || d.Spec.Strategy.RollingUpdate == nil || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("Deployment: %d replicas, strategy %+v; want 2 and maxUnavailable 0", *d.Spec.Replicas, d.Spec.Strategy)
	}
	pod := d.Spec.Template.Spec
	ctr := pod.Containers[0]
	if pod.ServiceAccountName != provision.ControlPlaneServiceAccount || ctr.ReadinessProbe == nil || ctr.LivenessProbe == nil ||
		ctr.ReadinessProbe.HTTPGet.Path != "/readyz" || ctr.LivenessProbe.HTTPGet.Path != "/livez" || ctr.Lifecycle.PreStop.Sleep == nil {
		t.Errorf("pod: service account %q, probes %+v %+v, lifecycle %+v", pod.ServiceAccountName, ctr.ReadinessProbe, ctr.LivenessProbe, ctr.Lifecycle)
	}
	env := envOf(ctr)
	if got := env["TALKIDE_WORKER_IMAGE"].Value; got != "registry.invalid/talkide-worker:0.1.0" {
		t.Errorf("TALKIDE_WORKER_IMAGE %q; want no registry but .invalid, the chart's appVersion tag", got)
	}
	if got := env["TALKIDE_CONFIG_REVISION"].Value; got != "1" {
		t.Errorf("TALKIDE_CONFIG_REVISION %q; want the release revision, 1", got)
	}
	if e, ok := env["TALKIDE_WORKER_BUILD_IMAGE"]; ok {
		t.Errorf("TALKIDE_WORKER_BUILD_IMAGE %+v by default; want it unset (no builds in Kubernetes until an operator names the image)", e)
	}
	for _, name := range []string{"TALKIDE_DATABASE_URL", "TALKIDE_MASTER_KEYS", "ANTHROPIC_API_KEY"} {
		if ref := env[name].ValueFrom; ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "talkide-controlplane" || ref.SecretKeyRef.Optional != nil {
			t.Errorf("%s: %+v; want it from Secret talkide-controlplane, required", name, env[name])
		}
	}
	if env["TALKIDE_PROVISIONER"].Value != "kubernetes" {
		t.Error("the provisioner is off by default")
	}
}

func checkFullRender(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	if find(objs, "ClusterRole", provision.ClusterRoleName) != nil || find(objs, "ValidatingAdmissionPolicy", provision.JobPolicyName) != nil {
		t.Error("provisioner.clusterPolicies=false still renders the cluster-scoped policies")
	}
	ing := find(objs, "Ingress", "talkide-controlplane")
	if ing == nil {
		t.Fatal("ingress.enabled renders no Ingress")
	}
	paths, _, _ := unstructured.NestedSlice(ing.Object, "spec", "rules")
	if s := fmt.Sprint(paths); strings.Contains(s, "/api/internal") || strings.Contains(s, "/api/admin") || !strings.Contains(s, "/api/conversations") {
		t.Errorf("the Ingress routes %s", s)
	}
	d := convert[appsv1.Deployment](t, find(objs, "Deployment", "talkide-controlplane"))
	env := envOf(d.Spec.Template.Spec.Containers[0])
	want := map[string]string{
		"TALKIDE_WORKER_IMAGE":            "registry.example/talkide-worker@sha256:0000000000000000000000000000000000000000000000000000000000000002",
		"TALKIDE_WORKER_BUILD_IMAGE":      "registry.example/talkide-builder-gradle@sha256:0000000000000000000000000000000000000000000000000000000000000003",
		"TALKIDE_WORKER_ENV":              "TALKIDE_IDLE_TIMEOUT=30m,TALKIDE_MAX_PROCESSES=8",
		"TALKIDE_WORKER_EGRESS_CIDRS":     "10.20.0.0/16,192.168.7.0/24",
		"TALKIDE_WORKER_GATEWAY_URL":      "http://talkide-controlplane." + d.Namespace + ".svc.cluster.example:8080",
		"TALKIDE_WORKER_URL_TEMPLATE":     "http://talkide-worker.{tenant}-{env}.svc.cluster.example:8080",
		"TALKIDE_INSTALLATION":            "acme-prod",
		"TALKIDE_WORKER_CPU_LIMIT":        "4",
		"TALKIDE_FAIR_USE_MAX_REQUESTS":   "60",
		"TALKIDE_IDENTITY_ROTATION_GRACE": "30m",
	}
	for name, v := range want {
		if env[name].Value != v {
			t.Errorf("%s = %q; want %q", name, env[name].Value, v)
		}
	}
	if got := d.Spec.Template.Spec.Containers[0].Image; got != "registry.example/talkide-controlplane@sha256:0000000000000000000000000000000000000000000000000000000000000001" {
		t.Errorf("image %q", got)
	}
	if ref := env["TALKIDE_MASTER_KEYS"].ValueFrom; ref == nil || ref.SecretKeyRef.Name != "talkide-secrets" {
		t.Errorf("secret.name not used: %+v", env["TALKIDE_MASTER_KEYS"])
	}
	pod := d.Spec.Template
	if pod.Labels["team"] != "platform" || pod.Labels["app.kubernetes.io/name"] != "talkide-controlplane" || pod.Spec.PriorityClassName != "talkide-critical" ||
		len(pod.Spec.Volumes) != 2 || pod.Spec.Volumes[1].Name != "db-ca" || len(pod.Spec.Containers[0].VolumeMounts) != 2 {
		t.Errorf("pod labels %v, priority class %q, volumes %+v", pod.Labels, pod.Spec.PriorityClassName, pod.Spec.Volumes)
	}
	sa := find(objs, "ServiceAccount", "talkide-controlplane")
	if sa == nil || sa.GetAnnotations()["eks.amazonaws.com/role-arn"] == "" {
		t.Errorf("the ServiceAccount's annotations: %v", sa)
	}
}

// dryRunApply server-side applies every object with dryRun=All: the API
// server validates and admits each as it would a real one, and keeps none.
func dryRunApply(t *testing.T, dyn *dynClient, ns string, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := dyn.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Errorf("%s: %v", gvk, err)
			continue
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			if o.GetNamespace() != ns {
				t.Errorf("%s %s rendered into namespace %q, not the release's %q", gvk.Kind, o.GetName(), o.GetNamespace(), ns)
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		if _, err := ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "chart-test", Force: true, DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("the test cluster refuses %s %s: %v", gvk.Kind, o.GetName(), err)
		}
	}
}

type dynClient struct {
	*dynamic.DynamicClient
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// newDynClient is a dynamic client with a REST mapper, as the cluster's
// administrator.
func newDynClient(t *testing.T, c *kubetest.Cluster) *dynClient {
	t.Helper()
	cfg := c.AdminConfig()
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &dynClient{DynamicClient: dc, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(kc.Discovery()))}
}

// The chart installed into the test cluster with the images `make images`
// built: the control plane's Deployment becomes available (kwok runs its
// pods) under Pod Security "restricted"; the control plane, run as this
// binary with the installed Deployment's environment and its
// ServiceAccount's token (as its pod would), provisions two tenant-envs
// whose workers become available with the built worker image. Then `helm
// upgrade` with new images rolls the control plane's Deployment, and the
// upgraded control plane rolls every worker Deployment to the new worker
// image, each rollout complete.
func TestChartInstallProvisionUpgrade(t *testing.T) {
	bins := helmBins(t)
	imgs := builtImages(t)
	c := kubetest.Shared(t)
	kube := c.Client()
	ctx := context.Background()
	chart := filepath.Join(repoRoot(t), chartRel)

	// Another test of this package may have let its provisioner install
	// the Job policy with admin rights; the chart installs it here.
	dropClusterPolicies(t, c)
	t.Cleanup(func() { dropClusterPolicies(t, c) })

	ns := c.Namespace(t)
	nsObj, err := kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nsObj.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if _, err := kube.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
	}))
	t.Cleanup(upstream.Close)
	mk, _ := token.NewMasterKey("k1")
	admin := randomHex(32)
	if _, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "talkide-controlplane"},
		StringData: map[string]string{"database-url": pgtest.SchemaURL(t), "master-keys": mk.String(),
			"anthropic-api-key": "sk-ant-test", "admin-token": admin},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	cp, worker, builder := imgs["talkide-controlplane"], imgs["talkide-worker"], imgs["talkide-builder-gradle"]
	repo := func(img builtImage) string { return strings.Split(img.Ref, "@")[0] }
	install := []string{"install", "talkide", chart, "-n", ns, "--wait", "--timeout", "3m",
		"--set", "image.repository=" + repo(cp), "--set", "image.digest=" + cp.Digest,
		"--set", "worker.image.repository=" + repo(worker), "--set", "worker.image.digest=" + worker.Digest,
		"--set", "builds.gradleImage.repository=" + repo(builder), "--set", "builds.gradleImage.digest=" + builder.Digest,
		"--set", "upstreamURL=" + upstream.URL, "--set", "provisioner.resync=1s"}
	if out, err := helm(t, bins["4"], c.Kubeconfig(), install...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { helm(t, bins["4"], c.Kubeconfig(), "uninstall", "talkide", "-n", ns, "--wait") })
	d := rolledOut(t, kube, ns, "talkide-controlplane", cp.Ref)
	if *d.Spec.Replicas != 2 || d.Status.AvailableReplicas != 2 {
		t.Fatalf("control plane: %d of %d replicas available", d.Status.AvailableReplicas, *d.Spec.Replicas)
	}

	// The control plane as its pod runs it: the Deployment's environment
	// (Secret keys and fields resolved) and its ServiceAccount's token.
	start := func() *cpProcess {
		d, err := kube.AppsV1().Deployments(ns).Get(ctx, "talkide-controlplane", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		env := podEnv(t, kube, ns, d.Spec.Template.Spec.Containers[0])
		tok, err := c.Token(ctx, ns, provision.ControlPlaneServiceAccount, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		env = append(env, "KUBECONFIG="+kubetest.WriteKubeconfig(t, c.TokenConfig(tok), ns))
		return startControlPlaneProcess(t, env, "")
	}
	p := start()
	tenants := []string{"chart" + randomHex(3), "chart" + randomHex(3)}
	for _, tn := range tenants {
		t.Cleanup(func() {
			kube.CoreV1().Namespaces().Delete(context.Background(), provision.Namespace(tn, "dev"), metav1.DeleteOptions{})
		})
		if st, code := adminDo(t, p, admin, http.MethodPut, "/api/admin/workers/"+tn+"/dev"); code != http.StatusOK {
			t.Fatalf("provision %s: %d %+v\n%s", tn, code, st, p.Log())
		}
	}
	for _, tn := range tenants {
		waitWorker(t, p, admin, tn, worker.Ref)
		d := rolledOut(t, kube, provision.Namespace(tn, "dev"), provision.WorkerName, worker.Ref)
		// The builder image reaches every worker, which runs its build Jobs in it.
		if got := envOf(d.Spec.Template.Spec.Containers[0])["TALKIDE_BUILD_IMAGE"].Value; got != builder.Ref {
			t.Errorf("worker %s/dev: TALKIDE_BUILD_IMAGE %q, want the built builder image %s", tn, got, builder.Ref)
		}
	}

	// The upgrade: new images for both.
	newCP, newWorker := "sha256:"+sha256Hex("upgrade "+cp.Digest), "sha256:"+sha256Hex("upgrade "+worker.Digest)
	if out, err := helm(t, bins["4"], c.Kubeconfig(), "upgrade", "talkide", chart, "-n", ns, "--reset-then-reuse-values", "--wait", "--timeout", "3m",
		"--set", "image.digest="+newCP, "--set", "worker.image.digest="+newWorker); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rolledOut(t, kube, ns, "talkide-controlplane", repo(cp)+"@"+newCP)
	// As in the rollout, the new control plane starts while the old one
	// still runs (and resyncs each second): the new one rolls every worker
	// to the new image, and the old one does not roll them back.
	old := p
	p = start()
	gens := map[string]int64{}
	for _, tn := range tenants {
		waitWorker(t, p, admin, tn, repo(worker)+"@"+newWorker)
		gens[tn] = rolledOut(t, kube, provision.Namespace(tn, "dev"), provision.WorkerName, repo(worker)+"@"+newWorker).Generation
	}
	time.Sleep(3 * time.Second) // three of the old control plane's resyncs
	for _, tn := range tenants {
		d := rolledOut(t, kube, provision.Namespace(tn, "dev"), provision.WorkerName, repo(worker)+"@"+newWorker)
		if d.Generation != gens[tn] {
			t.Errorf("worker %s/dev changed again after its rollout (generation %d, then %d): the old control plane applied its configuration", tn, gens[tn], d.Generation)
		}
	}
	// A provision through the old one is recorded, refused with 503 and
	// Retry-After, and carried out by the new one.
	late := "chart" + randomHex(3)
	t.Cleanup(func() {
		kube.CoreV1().Namespaces().Delete(context.Background(), provision.Namespace(late, "dev"), metav1.DeleteOptions{})
	})
	req, _ := http.NewRequest(http.MethodPut, old.URL+"/api/admin/workers/"+late+"/dev", nil)
	req.Header.Set("Authorization", "Bearer "+admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "OutdatedConfig") {
		t.Errorf("provision through the old control plane: %d Retry-After %q %s; want 503 OutdatedConfig with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	waitWorker(t, p, admin, late, repo(worker)+"@"+newWorker)

	// The old one stops as its pod would.
	old.Cmd.Process.Signal(syscall.SIGTERM)
	<-old.Exited
	if old.Err != nil {
		t.Errorf("the old control plane's exit: %v\n%s", old.Err, old.Log())
	}

	// Uninstalled, the release leaves the policies its workers' Jobs need
	// (the workers outlive it), and a new install of it adopts them.
	if out, err := helm(t, bins["4"], c.Kubeconfig(), "uninstall", "talkide", "-n", ns, "--wait"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	adm := kube.AdmissionregistrationV1()
	for _, name := range []string{provision.JobPolicyName, provision.ScopePolicyName} {
		if _, err := adm.ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("after helm uninstall, ValidatingAdmissionPolicy %s: %v", name, err)
		}
		if _, err := adm.ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("after helm uninstall, ValidatingAdmissionPolicyBinding %s: %v", name, err)
		}
	}
	if _, err := kube.AppsV1().Deployments(provision.Namespace(tenants[0], "dev")).Get(ctx, provision.WorkerName, metav1.GetOptions{}); err != nil {
		t.Errorf("after helm uninstall, the worker: %v", err)
	}
	if out, err := helm(t, bins["4"], c.Kubeconfig(), install...); err != nil {
		t.Fatalf("install again after uninstall: %v\n%s", err, out)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// dropClusterPolicies deletes the cluster-scoped objects the chart
// installs, when they exist.
func dropClusterPolicies(t *testing.T, c *kubetest.Cluster) {
	ctx := context.Background()
	adm := c.Client().AdmissionregistrationV1()
	for _, name := range []string{provision.JobPolicyName, provision.ScopePolicyName} {
		if err := adm.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if err := adm.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	if err := c.Client().RbacV1().ClusterRoles().Delete(ctx, provision.ClusterRoleName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// podEnv resolves a container's environment as the kubelet would: values,
// Secret keys, the namespace field, and the memory limit; TALKIDE_HTTP_ADDR
// is left to the test (a loopback port).
func podEnv(t *testing.T, kube kubernetes.Interface, ns string, ctr corev1.Container) []string {
	t.Helper()
	var env []string
	for _, e := range ctr.Env {
		if e.Name == "TALKIDE_HTTP_ADDR" {
			continue
		}
		v := e.Value
		switch src := e.ValueFrom; {
		case src == nil:
		case src.SecretKeyRef != nil:
			s, err := kube.CoreV1().Secrets(ns).Get(context.Background(), src.SecretKeyRef.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			b, ok := s.Data[src.SecretKeyRef.Key]
			if !ok {
				if src.SecretKeyRef.Optional != nil && *src.SecretKeyRef.Optional {
					continue
				}
				t.Fatalf("%s: Secret %s has no key %s", e.Name, s.Name, src.SecretKeyRef.Key)
			}
			v = string(b)
		case src.FieldRef != nil && src.FieldRef.FieldPath == "metadata.namespace":
			v = ns
		case src.ResourceFieldRef != nil && src.ResourceFieldRef.Resource == "limits.memory":
			v = fmt.Sprint(ctr.Resources.Limits.Memory().Value())
		default:
			t.Fatalf("%s: a source this test cannot resolve: %+v", e.Name, src)
		}
		env = append(env, e.Name+"="+v)
	}
	return env
}

func adminDo(t *testing.T, p *cpProcess, admin, method, path string) (provision.Status, int) {
	t.Helper()
	req, _ := http.NewRequest(method, p.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st provision.Status
	b, _ := io.ReadAll(resp.Body)
	json.Unmarshal(b, &st)
	if resp.StatusCode >= 300 {
		t.Logf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return st, resp.StatusCode
}

// waitWorker waits until the admin API says tn/dev is Ready with image.
func waitWorker(t *testing.T, p *cpProcess, admin, tn, image string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		st, code := adminDo(t, p, admin, http.MethodGet, "/api/admin/workers/"+tn+"/dev")
		if code == http.StatusOK && st.Phase == provision.PhaseReady && st.Image == image {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker %s/dev: %d %+v; want Ready with %s\n%s", tn, code, st, image, p.Log())
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// rolledOut waits until Deployment ns/name runs image in every pod
// template container and its rollout is complete: the controller saw the
// latest generation and every replica is updated and available.
func rolledOut(t *testing.T, kube kubernetes.Interface, ns, name, image string) *appsv1.Deployment {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		d, err := kube.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && d.Spec.Template.Spec.Containers[0].Image == image && d.Status.ObservedGeneration >= d.Generation &&
			d.Status.UpdatedReplicas == *d.Spec.Replicas && d.Status.AvailableReplicas == *d.Spec.Replicas && d.Status.Replicas == *d.Spec.Replicas {
			return d
		}
		if time.Now().After(deadline) {
			if d != nil {
				t.Fatalf("Deployment %s/%s: image %s, status %+v; want %s rolled out", ns, name, d.Spec.Template.Spec.Containers[0].Image, d.Status, image)
			}
			t.Fatalf("Deployment %s/%s: %v", ns, name, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// A control plane of a new configuration revision that cannot serve (its
// port taken, here) takes nothing over: it claims its revision only once it
// listens, so the replicas still serving keep the workers.
func TestRevisionThatCannotServeClaimsNothing(t *testing.T) {
	c := kubetest.Shared(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dbPath := filepath.Join(t.TempDir(), "cp.db")
	mk, _ := token.NewMasterKey("k1")
	cmd := controlPlaneCommand(t, "TALKIDE_HTTP_ADDR="+taken.Addr().String(), "TALKIDE_DB_PATH="+dbPath,
		"TALKIDE_MASTER_KEYS="+mk.String(), "TALKIDE_PROVISIONER=kubernetes", "TALKIDE_WORKER_IMAGE=example.invalid/w:1",
		"TALKIDE_CONFIG_REVISION=5", "KUBECONFIG="+c.Kubeconfig(), "TALKIDE_UPSTREAM_URL=http://127.0.0.1:1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "address already in use") {
		t.Fatalf("a control plane whose port is taken: %v\n%s", err, out)
	}
	db, err := controlstore.OpenSQLite(context.Background(), dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if rev, _, err := db.ConfigRevision(context.Background(), time.Now()); err != nil || rev != 0 {
		t.Fatalf("configuration revision in charge: %d, %v; want none claimed", rev, err)
	}
}

// A database URL whose password holds a raw '@' is refused at start with
// how to write it, and no part of the password reaches the log (pgx took
// what follows the first '@' for the host and logged it in a DNS error).
func TestDatabaseURLWithARawAtIsRefused(t *testing.T) {
	mk, _ := token.NewMasterKey("k1")
	cmd := controlPlaneCommand(t, "TALKIDE_MASTER_KEYS="+mk.String(), "TALKIDE_DATABASE_URL=postgres://u:SEC@RETPW@127.0.0.1:1/db")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "percent-encode") || strings.Contains(string(out), "RETPW") || strings.Contains(string(out), "SEC@") {
		t.Fatalf("%v\n%s", err, out)
	}
}
