package provision_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker"
)

// The whole lifecycle through the serving control plane's admin API: two
// tenant-envs provisioned; a conversation runs on a worker whose identity
// and request keys came from its Secret (mounted as the kubelet would) and
// whose Leases live in its namespace, as its ServiceAccount; the identity
// token is rotated while a turn streams, with zero failed mints, and the
// old one is refused after its grace; one tenant-env is deprovisioned and
// nothing of it is left, while the other is untouched.
func TestTwoTenantEnvsLifecycle(t *testing.T) {
	cluster := kubetest.Shared(t)
	kube := cluster.Client()
	ctx := context.Background()
	bin := platformtest.ClaudeBin(t)
	dir := platformtest.AgentReachableTempDir(t)
	log := testLogger(t)
	master, err := token.NewMasterKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(devupstream.New(devupstream.Config{APIKey: platformtest.UpstreamAPIKey, Logger: log}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	cpLn, _ := net.Listen("tcp", "127.0.0.1:0")
	wLn, _ := net.Listen("tcp", "127.0.0.1:0")
	cpURL := "http://" + cpLn.Addr().String()

	r := &rig{t: t, kube: kube}
	tn := r.tenant()
	const admin = "admin-token-0123456789abcdef"
	userTok := "tk_" + token.NewID()
	var mintCalls, mintFailures atomic.Int64
	cpCfg := controlplane.Config{
		DBPath: filepath.Join(dir, "cp.db"), MasterKeys: []token.MasterKey{master}, Upstream: upURL, APIKey: platformtest.UpstreamAPIKey,
		// One worker runs here, for tenant-env dev; its pod (kwok) runs
		// nothing.
		WorkerURLTemplate: "http://" + wLn.Addr().String(), AdminToken: admin,
		DevUserToken: userTok, DevGrants: [][2]string{{tn, "dev"}},
		Provisioner: "kubernetes", Kubeconfig: cluster.Kubeconfig(),
		Provision: provision.Config{Installation: "lifecycle", Image: "example.invalid/talkide-worker:test", ControlPlaneNamespace: "talkide-system",
			// The controller acts on changes and on due tokens; the resync
			// is only its backstop. The grace outlasts a rotate request
			// on a loaded machine (it waits for a reconcile in flight).
			Grace: 8 * time.Second, Resync: 10 * time.Second, TerminatingWait: 5 * time.Second},
		Logger: log.With("component", "controlplane"),
	}
	if err := cpCfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cpCtx, stopCP := context.WithCancel(ctx)
	cpDone := make(chan struct{})
	cpCfg.Middleware = func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != contract.PathMint || r.Header.Get("X-Test-Probe") != "" {
				h.ServeHTTP(w, r)
				return
			}
			rec := httpapi.NewStatusRecorder(w)
			h.ServeHTTP(rec, r)
			mintCalls.Add(1)
			if rec.Status() != http.StatusOK {
				mintFailures.Add(1)
			}
		})
	}
	go func() {
		defer close(cpDone)
		if err := controlplane.Run(cpCtx, cpCfg, cpLn); err != nil {
			t.Errorf("control plane: %v", err)
		}
	}()
	t.Cleanup(func() { stopCP(); <-cpDone })

	adminDo := func(method, path string) (int, provision.Status) {
		t.Helper()
		req, _ := http.NewRequest(method, cpURL+path, nil)
		req.Header.Set("Authorization", "Bearer "+admin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var st provision.Status
		json.Unmarshal(b, &st)
		if resp.StatusCode >= 300 {
			t.Logf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		return resp.StatusCode, st
	}
	waitReady := func(env string) {
		t.Helper()
		r.waitFor(tn+"/"+env+" ready", 90*time.Second, func() (bool, error) {
			code, st := adminDo("GET", "/api/admin/workers/"+tn+"/"+env)
			return code == 200 && st.Phase == provision.PhaseReady, fmt.Errorf("%d %s %s %s", code, st.Phase, st.Reason, st.Message)
		})
	}
	r.waitFor("the control plane", 30*time.Second, func() (bool, error) {
		resp, err := http.Get(cpURL + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil, err
	})
	for _, env := range []string{"dev", "prod"} {
		if code, st := adminDo("PUT", "/api/admin/workers/"+tn+"/"+env); code != 200 {
			t.Fatalf("provision %s: %d %+v", env, code, st)
		}
	}
	waitReady("dev")
	waitReady("prod")

	// The worker of dev, as in its pod: the Secret mounted the way the
	// kubelet mounts it, request keys from it, Leases as its
	// ServiceAccount.
	ns := tn + "-dev"
	secretDir := filepath.Join(dir, "secret")
	mirrorCtx, stopMirror := context.WithCancel(ctx)
	defer stopMirror()
	go mirrorSecret(mirrorCtx, kube, ns, provision.SecretName, secretDir)
	r.waitFor("the mounted Secret", 30*time.Second, func() (bool, error) {
		_, err := os.Stat(filepath.Join(secretDir, provision.SecretKeyID))
		return err == nil, err
	})
	sec, err := kube.CoreV1().Secrets(ns).Get(ctx, provision.SecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reqKeys, err := token.ParseKeys(string(sec.Data[provision.SecretKeyReq]))
	if err != nil {
		t.Fatal(err)
	}
	saTok, err := cluster.Token(ctx, ns, provision.WorkerName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubetest.WriteKubeconfig(t, cluster.TokenConfig(saTok), ns))
	t.Setenv("POD_NAMESPACE", ns)
	cpU, _ := url.Parse(cpURL)
	wCfg := worker.Config{
		Tenant: tn, Env: "dev", RequestKeys: reqKeys, GatewayBaseURL: cpU,
		IdentityTokenFile: filepath.Join(secretDir, provision.SecretKeyID),
		SessionDir:        filepath.Join(dir, "sessions"), ClaudeBin: bin, LeaseBackend: "kubernetes",
		Logger: log.With("component", "worker"),
	}
	if err := os.MkdirAll(wCfg.SessionDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := wCfg.Validate(); err != nil {
		t.Fatal(err)
	}
	wCtx, stopW := context.WithCancel(ctx)
	wDone := make(chan struct{})
	go func() {
		defer close(wDone)
		if err := worker.Run(wCtx, wCfg, wLn); err != nil {
			t.Errorf("worker: %v", err)
		}
	}()
	t.Cleanup(func() { stopW(); <-wDone })

	p := &platformtest.Platform{T: t, URL: cpURL, UserToken: userTok, Tenant: tn, Env: "dev"}
	conv := p.NewConversation()
	s := p.OpenStream(conv, 0)
	turn := func(text string) {
		t.Helper()
		p.Send(conv, text)
		ev := s.Until(2*time.Minute, platformtest.TurnEnd)
		if ev.Type != contract.EventTurnCompleted {
			t.Fatalf("turn %q ended with %s: %s", text, ev.Type, platformtest.Summary(s.Events))
		}
	}
	turn("please run `echo one`")
	leases, err := kube.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(leases.Items) == 0 {
		t.Fatalf("no Lease of the worker in %s: %v", ns, err)
	}

	// Rotate while a turn streams.
	oldTok := secretToken(t, kube, ns)
	p.Send(conv, "please run `sleep 2; echo two`")
	if code, st := adminDo("POST", "/api/admin/workers/"+tn+"/dev/rotate-identity"); code != 200 || st.Identity == nil || len(st.Identity.Retiring) != 1 {
		t.Fatalf("rotate: %d %+v", code, st.Identity)
	}
	if ev := s.Until(2*time.Minute, platformtest.TurnEnd); ev.Type != contract.EventTurnCompleted {
		t.Fatalf("the turn during rotation ended with %s", ev.Type)
	}
	r.waitFor("the old identity token to be revoked after its grace", 60*time.Second, func() (bool, error) {
		_, st := adminDo("GET", "/api/admin/workers/"+tn+"/dev")
		return st.Identity != nil && len(st.Identity.Retiring) == 0, fmt.Errorf("%+v", st.Identity)
	})
	if code := mintCodeHTTP(t, cpURL, oldTok); code != http.StatusUnauthorized {
		t.Fatalf("the old identity token after its grace: mint answered %d, want 401", code)
	}
	turn("please run `echo three`")
	if mintCalls.Load() == 0 || mintFailures.Load() != 0 {
		t.Fatalf("mints: %d calls, %d failed; want none failed", mintCalls.Load(), mintFailures.Load())
	}

	// Deprovision prod: nothing of it is left, dev is untouched.
	devBefore := resourceVersions(t, kube, ns)
	prodTok := secretToken(t, kube, tn+"-prod")
	if code, _ := adminDo("DELETE", "/api/admin/workers/"+tn+"/prod"); code != 200 && code != 202 {
		t.Fatalf("deprovision: %d", code)
	}
	r.waitFor("prod gone", 90*time.Second, func() (bool, error) {
		code, st := adminDo("GET", "/api/admin/workers/"+tn+"/prod")
		return code == 200 && st.Phase == provision.PhaseAbsent && st.Desired == "", fmt.Errorf("%d %+v", code, st)
	})
	if _, err := kube.CoreV1().Namespaces().Get(ctx, tn+"-prod", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("prod namespace: %v", err)
	}
	if code := mintCodeHTTP(t, cpURL, prodTok); code != http.StatusUnauthorized {
		t.Errorf("prod's identity token after deprovision: mint answered %d, want 401", code)
	}
	pvs, _ := kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	for _, pv := range pvs.Items {
		if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == tn+"-prod" && pv.Status.Phase != "Released" {
			t.Errorf("volume %s of prod still %s", pv.Name, pv.Status.Phase)
		}
	}
	sel := provision.LabelTenant + "=" + tn + "," + provision.LabelEnv + "=prod"
	if crs, _ := kube.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{LabelSelector: sel}); len(crs.Items) > 0 {
		t.Errorf("cluster role bindings of prod left: %d", len(crs.Items))
	}
	if !reflect.DeepEqual(devBefore, resourceVersions(t, kube, ns)) {
		t.Error("deprovisioning prod changed dev's objects")
	}
	waitReady("dev")
	turn("please run `echo four`")
}

// mintCodeHTTP asks the control plane's mint over HTTP for a conversation
// that does not exist: 403 means the identity token is valid, 401 refused.
func mintCodeHTTP(t *testing.T, base, tok string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", base+contract.PathMint, strings.NewReader(`{"conversation_id":"c-doesnotexist"}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Test-Probe", "1") // not the worker's: not counted
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// mirrorSecret plays the kubelet's Secret volume: each key of Secret
// ns/name is a symbolic link <dir>/<key> → ..data/<key>, and ..data a link
// to a timestamped directory that an update replaces with rename(2), as
// the kubelet's AtomicWriter does.
func mirrorSecret(ctx context.Context, kube kubernetes.Interface, ns, name, dir string) {
	var last string
	for ctx.Err() == nil {
		sec, err := kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && sec.ResourceVersion != last {
			if writeAtomic(dir, sec.Data) == nil {
				last = sec.ResourceVersion
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func writeAtomic(dir string, data map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ts, err := os.MkdirTemp(dir, "..ts-")
	if err != nil {
		return err
	}
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(ts, k), v, 0o400); err != nil {
			return err
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return err
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	for k := range data {
		link := filepath.Join(dir, k)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", k), link); err != nil {
				return err
			}
		}
	}
	if old != "" {
		os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}
