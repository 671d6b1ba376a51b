// Package realnode_test runs the platform on the test cluster's real node
// (kubetest.SharedNode: kubelet, containerd and runc, so containers really
// run): the control plane in the test, on the node's host address, with
// its K8sWorkerProvisioner; each tenant-env's worker a pod of the image
// `make images` built, running the real Claude Code CLI in its jails; the
// development upstream standing in for Anthropic. docs/testing.md, "The
// real node", says what each test holds.
package realnode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// Repositories the node knows the images of `make images` by (no registry
// exists here); pods name them by digest.
const (
	workerRepo  = "talkide.local/talkide-worker"
	builderRepo = "talkide.local/talkide-builder-gradle"
)

var images struct {
	once            sync.Once
	worker, builder string
	err             error
}

// node returns the shared cluster with the real node, with the worker and
// builder images of `make images` imported (once), and points this test
// binary's name lookups at the cluster's DNS, as a control plane in the
// cluster resolves workers' Services.
func node(t *testing.T) *kubetest.Cluster {
	t.Helper()
	c := kubetest.SharedNode(t)
	images.once.Do(func() {
		images.worker, images.builder, images.err = importImages(c)
		net.DefaultResolver = c.ClusterDNS()
	})
	if images.err != nil {
		t.Fatalf("the images of `make images`: %v", images.err)
	}
	return c
}

func importImages(c *kubetest.Cluster) (worker, builder string, err error) {
	root, err := kubetest.RepoRoot()
	if err != nil {
		return "", "", err
	}
	ref := func(name, repo string) (string, error) {
		layout := filepath.Join(root, ".cache", "images", "oci", name)
		digest, err := kubetest.LayoutDigest(layout)
		if err != nil {
			return "", fmt.Errorf("%w (build the images with `make images`)", err)
		}
		if err := c.ImportImage(context.Background(), kubetest.NodeImage{Layout: layout, Repository: repo}); err != nil {
			return "", err
		}
		return repo + "@" + digest, nil
	}
	if worker, err = ref("talkide-worker", workerRepo); err != nil {
		return "", "", err
	}
	builder, err = ref("talkide-builder-gradle", builderRepo)
	return worker, builder, err
}

// plane is a control plane serving on the node's host address, whose
// provisioner makes workers on the real node.
type plane struct {
	*platformtest.Platform
	t       *testing.T
	cluster *kubetest.Cluster
	admin   string
	// mints counts mint calls and the failed ones (rotation).
	mints, mintFailures atomic.Int64
	// stop ends it (also at cleanup).
	stop func()
}

const adminToken = "admin-token-realnode-0123456789"

// startPlane starts a control plane for one tenant-env (a fresh tenant
// name), its provisioner configured by cfg after the defaults here.
func startPlane(t *testing.T, c *kubetest.Cluster, cfg func(*provision.Config)) *plane {
	t.Helper()
	logs := &platformtest.LogBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane log:\n%s", tail(logs.String(), 60))
		}
	})
	master, err := token.NewMasterKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(devupstream.New(devupstream.Config{APIKey: platformtest.UpstreamAPIKey, Logger: log.With("component", "upstream")}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	// Workers reach it from their pods: on the node's host address.
	ln, err := net.Listen("tcp", kubetest.HostAddr+":0")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AllowPodsToHost(ln.Addr().(*net.TCPAddr).Port); err != nil {
		t.Fatal(err)
	}
	cpURL := "http://" + ln.Addr().String()
	tenant := "rn" + strings.ToLower(token.NewID()[:8])
	userTok := "tk_" + token.NewID()
	p := &plane{t: t, cluster: c, admin: adminToken,
		Platform: &platformtest.Platform{T: t, URL: cpURL, UserToken: userTok, Tenant: tenant, Env: "dev"}}
	pc := provision.Config{
		Installation: "rn-" + tenant, Image: images.worker, BuildImage: images.builder,
		GatewayURL: cpURL, ControlPlaneNamespace: "talkide-system", HostUIDDir: kubetest.NodeHostUIDDir,
		StorageClass: kubetest.StorageClass, StorageSize: resource.MustParse("1Gi"),
		Resync: 2 * time.Second, TerminatingWait: 10 * time.Second,
		// Small requests: the node is this machine.
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
			Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")}},
	}
	if cfg != nil {
		cfg(&pc)
	}
	cp := controlplane.Config{
		DBPath: filepath.Join(t.TempDir(), "cp.db"), MasterKeys: []token.MasterKey{master},
		Upstream: upURL, APIKey: platformtest.UpstreamAPIKey, AdminToken: adminToken,
		DevUserToken: userTok, DevGrants: [][2]string{{tenant, "dev"}},
		Provisioner: "kubernetes", Kubeconfig: c.Kubeconfig(), Provision: pc,
		Logger: log.With("component", "controlplane"),
	}
	cp.Middleware = func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != contract.PathMint || r.Header.Get(probeHeader) != "" {
				h.ServeHTTP(w, r)
				return
			}
			rec := httpapi.NewStatusRecorder(w)
			h.ServeHTTP(rec, r)
			p.mints.Add(1)
			if rec.Status() != http.StatusOK {
				p.mintFailures.Add(1)
			}
		})
	}
	if err := cp.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := controlplane.Run(ctx, cp, ln); err != nil {
			t.Errorf("control plane: %v", err)
		}
	}()
	var once sync.Once
	p.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(p.stop)
	return p
}

// adminDo calls the operator API and decodes a status.
func (p *plane) adminDo(method, path string) (int, provision.Status, string) {
	p.t.Helper()
	req, _ := http.NewRequest(method, p.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+p.admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var st provision.Status
	json.Unmarshal(b, &st)
	return resp.StatusCode, st, string(b)
}

func (p *plane) workerPath() string { return "/api/admin/workers/" + p.Tenant + "/" + p.Env }

// provision provisions the plane's tenant-env and waits until its worker
// is Ready (its pod passed its real probes), up to three minutes.
func (p *plane) provision() provision.Status {
	p.t.Helper()
	if code, _, body := p.adminDo("PUT", p.workerPath()); code >= 300 {
		p.t.Fatalf("provision: %d %s", code, body)
	}
	return p.waitPhase("Ready", 3*time.Minute)
}

// waitPhase waits for the worker's status to reach phase.
func (p *plane) waitPhase(phase string, within time.Duration) provision.Status {
	p.t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		_, st, body := p.adminDo("GET", p.workerPath())
		if st.Phase == phase {
			return st
		}
		last = body
		if time.Now().After(deadline) {
			p.t.Fatalf("worker not %s within %s; last status %s\n%s", phase, within, last, p.describeWorker())
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// namespace is the tenant-env's namespace.
func (p *plane) namespace() string { return provision.Namespace(p.Tenant, p.Env) }

// workerPod returns the tenant-env's worker pod that runs (the newest).
func (p *plane) workerPod() *corev1.Pod {
	p.t.Helper()
	pods, err := p.cluster.Client().CoreV1().Pods(p.namespace()).List(context.Background(), metav1.ListOptions{LabelSelector: provision.LabelName + "=" + provision.WorkerName})
	if err != nil {
		p.t.Fatal(err)
	}
	var best *corev1.Pod
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
			continue
		}
		if best == nil || pod.CreationTimestamp.After(best.CreationTimestamp.Time) {
			best = pod
		}
	}
	if best == nil {
		p.t.Fatalf("no running worker pod in %s", p.namespace())
	}
	return best
}

// describeWorker is the worker pods' status, events and log tails, for a
// failure message.
func (p *plane) describeWorker() string {
	ctx := context.Background()
	var b strings.Builder
	pods, _ := p.cluster.Client().CoreV1().Pods(p.namespace()).List(ctx, metav1.ListOptions{})
	if pods != nil {
		for _, pod := range pods.Items {
			fmt.Fprintf(&b, "pod %s on %q: %s", pod.Name, pod.Spec.NodeName, pod.Status.Phase)
			for _, s := range pod.Status.ContainerStatuses {
				fmt.Fprintf(&b, "; %s ready=%v restarts=%d %+v", s.Name, s.Ready, s.RestartCount, s.State)
			}
			b.WriteString("\n")
			logs, _ := p.cluster.Client().CoreV1().Pods(p.namespace()).GetLogs(pod.Name, &corev1.PodLogOptions{TailLines: ptrInt64(40)}).DoRaw(ctx)
			fmt.Fprintf(&b, "--- log of %s ---\n%s\n", pod.Name, logs)
		}
	}
	evs, _ := p.cluster.Client().CoreV1().Events(p.namespace()).List(ctx, metav1.ListOptions{})
	if evs != nil {
		for _, e := range evs.Items {
			fmt.Fprintf(&b, "event %s %s/%s %s: %s\n", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	return b.String()
}

func ptrInt64(n int64) *int64 { return &n }

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitRestarted waits until the pod's worker container has restarted at
// least n times and the tenant-env is Ready again.
func (p *plane) waitRestarted(pod string, n int32) {
	p.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got, err := p.cluster.Client().CoreV1().Pods(p.namespace()).Get(context.Background(), pod, metav1.GetOptions{})
		if err == nil && len(got.Status.ContainerStatuses) == 1 && got.Status.ContainerStatuses[0].RestartCount >= n && got.Status.ContainerStatuses[0].Ready {
			break
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("the worker container did not restart and get ready in 3 minutes\n%s", p.describeWorker())
		}
		time.Sleep(500 * time.Millisecond)
	}
	p.waitPhase("Ready", time.Minute)
}

// waitReplaced waits until pod old is gone and another worker pod is
// Ready.
func (p *plane) waitReplaced(old string) {
	p.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		_, err := p.cluster.Client().CoreV1().Pods(p.namespace()).Get(context.Background(), old, metav1.GetOptions{})
		_, st, _ := p.adminDo("GET", p.workerPath())
		if apierrors.IsNotFound(err) && st.Phase == "Ready" && st.ReadyReplicas > 0 {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("the worker pod was not replaced in 3 minutes\n%s", p.describeWorker())
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// secretToken is the identity token in the worker's Secret.
func (p *plane) secretToken() string {
	p.t.Helper()
	sec, err := p.cluster.Client().CoreV1().Secrets(p.namespace()).Get(context.Background(), provision.SecretName, metav1.GetOptions{})
	if err != nil {
		p.t.Fatal(err)
	}
	return string(sec.Data[provision.SecretKeyID])
}

// mintCode asks the mint, with identity token tok, for a conversation that
// does not exist: 403 means the token is valid, 401 refused. Not counted
// as the worker's mint.
func (p *plane) mintCode(tok string) int {
	p.t.Helper()
	req, _ := http.NewRequest("POST", p.URL+contract.PathMint, strings.NewReader(`{"conversation_id":"c-doesnotexist"}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(probeHeader, "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// probeHeader marks the test's own mint calls.
const probeHeader = "X-Test-Probe"

// volumePath is the node directory of the tenant-env's session volume.
func (p *plane) volumePath() string {
	p.t.Helper()
	ctx := context.Background()
	pvc, err := p.cluster.Client().CoreV1().PersistentVolumeClaims(p.namespace()).Get(ctx, provision.PVCName, metav1.GetOptions{})
	if err != nil {
		p.t.Fatal(err)
	}
	pv, err := p.cluster.Client().CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil || pv.Spec.HostPath == nil {
		p.t.Fatalf("volume of %s: %v", pvc.Name, err)
	}
	return pv.Spec.HostPath.Path
}
