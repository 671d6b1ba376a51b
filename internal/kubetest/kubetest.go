// Package kubetest runs a real Kubernetes control plane for tests, built
// from the Go module proxy: etcd, kube-apiserver (RBAC, ServiceAccount
// token signing, TokenRequest), kube-controller-manager (every default
// controller, each with its own ServiceAccount credentials),
// kube-scheduler and kwok, which plays the kubelet of fake nodes: their
// pods run at once, Job pods succeed, and container logs stream through the
// API server. Every listener is on 127.0.0.1; the state lives in a
// temporary directory.
//
// The binaries' versions are pinned in versions.env (the Makefile reads
// the same file); EnsureBuilt compiles them into .cache/k8s/<versions>/
// in the repository once (`make cluster-bins`).
//
// A test package calls Main from its TestMain and Shared from a test: the
// first call starts the cluster (about 5 s), later calls share it, and Main
// stops it after the tests. Each test isolates itself in its own
// namespace (Namespace) and acts as a ServiceAccount limited by a Role
// (ServiceAccountConfig). A cluster that cannot start, or missing
// binaries that cannot be built, fail the test: it never skips.
//
// Main types: Cluster, Options, Versions. It is for tests and the
// `make cluster` command, never for production code.
package kubetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/talkide/talkide/internal/testlane"
	"github.com/talkide/talkide/internal/worker/sandbox"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

var shared struct {
	// mainCalled is set by Main before any test runs.
	mainCalled bool
	once       sync.Once
	cluster    *Cluster
	err        error
}

var sharedNode struct {
	once    sync.Once
	cluster *Cluster
	err     error
}

// Main runs the package's tests, stops the shared clusters if a test
// started them, and exits with the tests' status. Call it as the whole
// body of the package's TestMain. After a real node (SharedNode) stops, it
// checks that the host is as it was before the node started (no process,
// mount, cgroup, link, route, rule, sysctl or file left) and fails the
// package if not.
//
// The test binary is also the helper of agents' jails
// (sandbox.MaybeRunHelper), as the worker's binary is.
func Main(m *testing.M) {
	sandbox.MaybeRunHelper()
	shared.mainCalled = true
	code := m.Run()
	if shared.cluster != nil {
		shared.cluster.Stop()
	}
	if sharedNode.cluster != nil {
		sharedNode.cluster.Stop()
		if left := sharedNode.cluster.TeardownLeftovers(); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: kubetest: the real node's teardown left this behind:\n  %s\n", strings.Join(left, "\n  "))
			if code == 0 {
				code = 1
			}
		} else {
			fmt.Fprintln(os.Stderr, "kubetest: the real node's teardown left nothing behind (processes, mounts, cgroups, links, routes, nftables rules, sysctls, host paths)")
		}
	}
	os.Exit(code)
}

// NoNetworkPolicyEnforcement is said wherever a real node starts on a
// kernel without nftables' queue.
const NoNetworkPolicyEnforcement = "kubetest: NetworkPolicy enforcement is NOT tested on this machine: kube-network-policies needs nftables' queue " +
	"(CONFIG_NFT_QUEUE), which this kernel lacks; the policies are tested as objects only (internal/controlplane/provision)"

// SharedNode returns the package's cluster with a real node (Options.
// RealNode), starting it on first use and building the node's binaries
// when they are missing. It fails t when the machine cannot run a real
// node or the cluster does not start; it never skips. Main stops it and
// checks its teardown.
func SharedNode(t testing.TB) *Cluster {
	t.Helper()
	testlane.NeedsCluster(t)
	if !shared.mainCalled {
		t.Fatal("kubetest: call kubetest.Main(m) from the package's TestMain, so the cluster is stopped after the tests")
	}
	sharedNode.once.Do(func() {
		sharedNode.cluster, sharedNode.err = startSharedNode()
	})
	if sharedNode.err != nil {
		t.Fatalf("kubetest: the test cluster with a real node did not start: %v\n"+
			"Build its binaries with `make cluster-bins` (docs/testing.md, \"Test cluster\").", sharedNode.err)
	}
	return sharedNode.cluster
}

func startSharedNode() (*Cluster, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	v := Pinned()
	ctx := context.Background()
	if err := EnsureBuilt(ctx, BinDir(root, v), v, os.Stderr); err != nil {
		return nil, err
	}
	if err := EnsureNodeBuilt(ctx, NodeBinDir(root, v), v, os.Stderr); err != nil {
		return nil, err
	}
	var log io.Writer
	if testing.Verbose() {
		log = os.Stderr
	}
	for attempt := 1; ; attempt++ {
		c, err := Start(ctx, Options{BinDir: BinDir(root, v), NodeBinDir: NodeBinDir(root, v), RealNode: true, Log: log})
		if err == nil {
			if f, _ := c.Node(); !f.NFTQueue {
				fmt.Fprintln(os.Stderr, NoNetworkPolicyEnforcement)
			}
		}
		if err == nil || attempt == 3 || !retryableStart(err) {
			return c, err
		}
		fmt.Fprintf(os.Stderr, "kubetest: the test cluster did not start (attempt %d of 3), starting it again: %v\n", attempt, firstLine(err.Error()))
	}
}

// Shared returns the package's cluster, starting it (and building the
// binaries when they are missing) on first use. It fails t when the
// cluster cannot start; it never skips.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	testlane.NeedsCluster(t)
	if !shared.mainCalled {
		t.Fatal("kubetest: call kubetest.Main(m) from the package's TestMain, so the cluster is stopped after the tests")
	}
	shared.once.Do(func() {
		shared.cluster, shared.err = startShared()
	})
	if shared.err != nil {
		t.Fatalf("kubetest: the test cluster did not start: %v\n"+
			"Build its binaries with `make cluster-bins` (docs/testing.md, \"Test cluster\").", shared.err)
	}
	return shared.cluster
}

func startShared() (*Cluster, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	v := Pinned()
	dir := BinDir(root, v)
	ctx := context.Background()
	if err := EnsureBuilt(ctx, dir, v, os.Stderr); err != nil {
		return nil, err
	}
	var log io.Writer // progress only with -v
	if testing.Verbose() {
		log = os.Stderr
	}
	// The ports are free when picked, but test binaries of other packages
	// pick theirs at the same time: a port taken in between is retried.
	// So is a component that died while starting: kwok 0.8.0 now and then
	// panics while it builds its CEL environment (easycel getTypeValue),
	// before it serves anything.
	for attempt := 1; ; attempt++ {
		c, err := Start(ctx, Options{BinDir: dir, Log: log})
		if err == nil || attempt == 3 || !retryableStart(err) {
			return c, err
		}
		fmt.Fprintf(os.Stderr, "kubetest: the test cluster did not start (attempt %d of 3), starting it again: %v\n", attempt, firstLine(err.Error()))
	}
}

// Namespace creates a namespace with a random name for t, waits until its
// default ServiceAccount exists (pods need it), and deletes it when t ends.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	b := make([]byte, 4)
	rand.Read(b)
	name := "kt-" + strings.ToLower(sanitize(t.Name())) + "-" + hex.EncodeToString(b)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"talkide.dev/test": "true"}}}
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := c.client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("kubetest: delete namespace %s: %v", name, err)
		}
	})
	if err := c.poll(ctx, "ServiceAccount default in "+name, func(ctx context.Context) (bool, error) {
		_, err := c.client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, ignoreNotFound(err)
	}); err != nil {
		t.Fatal(err)
	}
	return name
}

// sanitize keeps a test name usable in a namespace name (63 characters in
// all with the prefix and suffix).
func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	out := strings.Trim(b.String(), "-")
	if len(out) > 40 {
		out = strings.TrimRight(out[:40], "-")
	}
	return out
}

// ServiceAccountConfig creates ServiceAccount name in ns with a Role
// granting exactly rules and a RoleBinding, mints a token for it through
// the TokenRequest API, and returns a client configuration that
// authenticates with that token only. It returns once the API server
// authorizes the first rule for the token, so a test never races the RBAC
// cache.
func (c *Cluster) ServiceAccountConfig(t testing.TB, ns, name string, rules []rbacv1.PolicyRule) *rest.Config {
	t.Helper()
	ctx := context.Background()
	if _, err := c.client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: create ServiceAccount %s/%s: %v", ns, name, err)
	}
	if len(rules) > 0 {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
		if _, err := c.client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatalf("kubetest: create Role %s/%s: %v", ns, name, err)
		}
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
		}
		if _, err := c.client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatalf("kubetest: create RoleBinding %s/%s: %v", ns, name, err)
		}
	}
	token, err := c.Token(ctx, ns, name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.TokenConfig(token)
	if len(rules) == 0 {
		return cfg
	}
	sa, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := rules[0]
	attr := &authzv1.ResourceAttributes{Namespace: ns, Verb: r.Verbs[0], Group: first(r.APIGroups), Resource: first(r.Resources)}
	if err := c.poll(ctx, fmt.Sprintf("RBAC to allow %s/%s %s", ns, name, r.Verbs[0]), func(ctx context.Context) (bool, error) {
		rev, err := sa.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
			Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: attr},
		}, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return rev.Status.Allowed, nil
	}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// Token mints a token for ServiceAccount ns/name through the TokenRequest
// API, valid for ttl.
func (c *Cluster) Token(ctx context.Context, ns, name string, ttl time.Duration) (string, error) {
	secs := int64(ttl / time.Second)
	tr, err := c.client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("kubetest: mint token for %s/%s: %w", ns, name, err)
	}
	return tr.Status.Token, nil
}

// WriteKubeconfig writes a kubeconfig file acting as cfg's bearer token
// against cfg's server, with namespace as its context's default (as a
// pod's in-cluster credentials act), and returns its path.
func WriteKubeconfig(t testing.TB, cfg *rest.Config, namespace string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u", Namespace: namespace}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// retryableStart reports whether a failed Start is worth another try: a
// port taken meanwhile, or a component that exited while starting.
func retryableStart(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "address already in use") || strings.Contains(msg, " exited (")
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
