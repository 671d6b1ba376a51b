package worker

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

const testKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://kube.test:6443
    insecure-skip-tls-verify: true
users:
- name: worker
  user:
    token: kube-token
contexts:
- name: with-ns
  context: {cluster: test, user: worker, namespace: acme-dev}
- name: without-ns
  context: {cluster: test, user: worker}
current-context: %s
`

// TestKubeConfigSelection checks where the Kubernetes lease backend takes
// its credentials (KUBECONFIG, else in-cluster) and its namespace
// (POD_NAMESPACE, else the service account's file, else the kubeconfig
// context's).
func TestKubeConfigSelection(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	withNS := write("with-ns.yaml", strings.Replace(testKubeconfig, "%s", "with-ns", 1))
	withoutNS := write("without-ns.yaml", strings.Replace(testKubeconfig, "%s", "without-ns", 1))
	nsFile := write("namespace", "file-ns\n")
	noFile := filepath.Join(dir, "no-namespace-file")

	cases := []struct {
		name                  string
		kubeconfig, podNS, ns string // ns: the namespace file
		wantNS                string
		wantErr               string
	}{
		{name: "kubeconfig context namespace", kubeconfig: withNS, ns: noFile, wantNS: "acme-dev"},
		{name: "kubeconfig list", kubeconfig: filepath.Join(dir, "absent.yaml") + string(filepath.ListSeparator) + withNS, ns: noFile, wantNS: "acme-dev"},
		{name: "namespace file before context", kubeconfig: withNS, ns: nsFile, wantNS: "file-ns"},
		{name: "POD_NAMESPACE first", kubeconfig: withNS, podNS: "pod-ns", ns: nsFile, wantNS: "pod-ns"},
		{name: "POD_NAMESPACE with a context without one", kubeconfig: withoutNS, podNS: "pod-ns", ns: noFile, wantNS: "pod-ns"},
		{name: "no namespace anywhere", kubeconfig: withoutNS, ns: noFile, wantErr: "set POD_NAMESPACE"},
		{name: "kubeconfig unreadable", kubeconfig: write("broken.yaml", "{not yaml"), ns: noFile, wantErr: "KUBECONFIG"},
		{name: "no KUBECONFIG outside a cluster", podNS: "pod-ns", ns: nsFile, wantErr: "set KUBECONFIG"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tc.kubeconfig)
			t.Setenv("POD_NAMESPACE", tc.podNS)
			t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a pod
			t.Setenv("KUBERNETES_SERVICE_PORT", "")
			rc, ns, err := kubeConfig(tc.ns)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				if tc.kubeconfig == "" && !errors.Is(err, rest.ErrNotInCluster) {
					t.Errorf("got %v, want the in-cluster error (rest.ErrNotInCluster)", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ns != tc.wantNS {
				t.Errorf("namespace: got %q, want %q", ns, tc.wantNS)
			}
			if rc.Host != "https://kube.test:6443" || rc.BearerToken != "kube-token" {
				t.Errorf("config: got host %q token %q, want the kubeconfig's", rc.Host, rc.BearerToken)
			}
		})
	}
}
