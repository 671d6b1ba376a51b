package worker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/talkide/talkide/internal/worker/lease"
)

// newLeaseManager returns the conversation lease backend of c.
func newLeaseManager(c Config, id lease.Identity) (lease.Manager, error) {
	cfg := lease.Config{Identity: id}
	if c.LeaseBackend == "kubernetes" {
		cs, ns, err := kubeClient()
		if err != nil {
			return nil, fmt.Errorf("kubernetes leases: %w", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = checkKubeRights(ctx, cs, ns, c.Logger)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("kubernetes leases: %w", err)
		}
		return lease.NewKubeManager(cs, ns, cfg)
	}
	return lease.NewFileManager(filepath.Join(c.SessionDir, "talkide", "leases"), cfg)
}

// serviceAccountNamespaceFile is where a pod finds its namespace.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// kubeConfig returns the client configuration and the namespace of the
// Kubernetes lease backend. Credentials come from the kubeconfig files in
// $KUBECONFIG (a list, as kubectl reads it) when it is set, else from the
// pod's service account (in-cluster). The namespace is $POD_NAMESPACE, else
// the one in nsFile (the service account's), else the kubeconfig's current
// context's; none of them is an error.
func kubeConfig(nsFile string) (*rest.Config, string, error) {
	var rc *rest.Config
	var contextNS string
	if kc := os.Getenv("KUBECONFIG"); kc != "" {
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{Precedence: filepath.SplitList(kc)}, &clientcmd.ConfigOverrides{})
		var err error
		if rc, err = cc.ClientConfig(); err != nil {
			return nil, "", fmt.Errorf("KUBECONFIG: %w", err)
		}
		raw, err := cc.RawConfig()
		if err != nil {
			return nil, "", fmt.Errorf("KUBECONFIG: %w", err)
		}
		if ctx := raw.Contexts[raw.CurrentContext]; ctx != nil {
			contextNS = ctx.Namespace
		}
	} else {
		var err error
		if rc, err = rest.InClusterConfig(); err != nil {
			return nil, "", fmt.Errorf("in-cluster credentials (outside a pod, set KUBECONFIG): %w", err)
		}
	}
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		if b, err := os.ReadFile(nsFile); err == nil {
			ns = strings.TrimSpace(string(b))
		}
	}
	if ns == "" {
		ns = contextNS
	}
	if ns == "" {
		return nil, "", fmt.Errorf("set POD_NAMESPACE: no namespace in %s nor in the kubeconfig's current context", nsFile)
	}
	return rc, ns, nil
}

// kubeClient is the Kubernetes client of the lease backend and of
// build Jobs, with the namespace: credentials and namespace as kubeConfig
// finds them.
func kubeClient() (kubernetes.Interface, string, error) {
	rc, ns, err := kubeConfig(serviceAccountNamespaceFile)
	if err != nil {
		return nil, "", err
	}
	cs, err := kubernetes.NewForConfig(rc)
	return cs, ns, err
}
