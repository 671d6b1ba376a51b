package clusterdemo

import (
	"bufio"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/platformtest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// TestInstallOnTheRealNode is the operator's path of `make cluster-demo`:
// the chart installed with the images of `make images`, its control plane
// a pod of the real node that provisions a tenant-env there through its own
// ServiceAccount, and a turn sent to it through its Service running in the
// worker's pod.
func TestInstallOnTheRealNode(t *testing.T) {
	c := kubetest.SharedNode(t)
	ctx := t.Context()
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	imgs := Images(root)
	if len(imgs) != len(ImageNames) {
		t.Fatal("the images of `make images` are not built")
	}
	for _, img := range imgs {
		if err := c.ImportImage(ctx, img); err != nil {
			t.Fatal(err)
		}
	}
	upURL, upKey, err := ServeUpstream(ctx, c.AllowPodsToHost)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Install(ctx, Options{Root: root, Kubeconfig: c.Kubeconfig(),
		Kubectl: filepath.Join(kubetest.BinDir(root, kubetest.Pinned()), "kubectl"), Helm: pinnedHelm(t, root),
		UpstreamURL: upURL, UpstreamKey: upKey, Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{Namespace, Tenant + "-" + Env} {
		pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) == 0 {
			t.Fatalf("pods of %s: %v", ns, err)
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName != kubetest.NodeName {
				t.Errorf("pod %s/%s runs on %q, want the real node", ns, p.Name, p.Spec.NodeName)
			}
		}
	}
	if !strings.Contains(res.URL, "#token="+res.UserToken) || !strings.HasPrefix(res.URL, res.BaseURL) {
		t.Errorf("URL %q", res.URL)
	}
	p := &platformtest.Platform{T: t, URL: res.BaseURL, UserToken: res.UserToken, Tenant: Tenant, Env: Env}
	conv := p.NewConversation()
	w := p.Watch(ctx, conv)
	id := p.SendRetrying(conv, "please run `cat /proc/sys/kernel/hostname; id -u`")
	ev, ok := w.TurnEnd(id, 3*time.Minute)
	if !ok || ev.Type != contract.EventTurnCompleted {
		t.Fatalf("turn: %v %s; events %s", ok, ev.Data, platformtest.Summary(w.Events()))
	}
	var out string
	for _, e := range w.Events() {
		if e.Type == contract.EventToolResult {
			out = platformtest.Payload[contract.ToolResult](t, e).Content
		}
	}
	if !strings.Contains(out, "talkide-agent") {
		t.Errorf("the command did not run in an agent's jail (its hostname is talkide-agent):\n%s", out)
	}
	// The page itself is served there.
	resp, err := http.Get(res.BaseURL + "/")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the UI at %s: %v %v", res.BaseURL, err, resp)
	}
	resp.Body.Close()

	// The control plane's pod replaced: its database (on a volume of its
	// own) keeps the user and the worker; installing again keeps both.
	if err := c.Client().CoreV1().Pods(Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	again, err := Install(ctx, Options{Root: root, Kubeconfig: c.Kubeconfig(),
		Kubectl: filepath.Join(kubetest.BinDir(root, kubetest.Pinned()), "kubectl"), Helm: pinnedHelm(t, root),
		UpstreamURL: upURL, UpstreamKey: upKey, Log: testLog{t}, UserToken: res.UserToken})
	if err != nil {
		t.Fatal(err)
	}
	if again.UserToken != res.UserToken || again.AdminToken != res.AdminToken {
		t.Errorf("a second install changed the user's or the admin's token")
	}
	if id := p.SendRetrying(conv, "please run `echo after-restart`"); true {
		if ev, ok := w.TurnEnd(id, 3*time.Minute); !ok || ev.Type != contract.EventTurnCompleted {
			t.Errorf("the conversation after the control plane's restart: %v %s", ok, ev.Data)
		}
	}
}

// pinnedHelm is the Helm 4 of deploy/versions.env, as `make helm` builds it.
func pinnedHelm(t *testing.T, root string) string {
	f, err := os.Open(filepath.Join(root, "deploy", "versions.env"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "HELM_VERSION="); ok {
			bin := filepath.Join(root, ".cache", "tools", "helm-"+v, "helm")
			if _, err := os.Stat(bin); err != nil {
				t.Fatalf("helm %s is not built: run `make helm` (make test does): %v", v, err)
			}
			return bin
		}
	}
	t.Fatal("deploy/versions.env has no HELM_VERSION")
	return ""
}

type testLog struct{ t *testing.T }

func (l testLog) Write(b []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
