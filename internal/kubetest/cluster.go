package kubetest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Options configure Start.
type Options struct {
	// BinDir holds the binaries (EnsureBuilt). Required.
	BinDir string
	// Dir is the state directory (certificates, kubeconfigs, etcd data,
	// logs). Empty: a new temporary directory, removed by Stop.
	Dir string
	// Nodes is the number of kwok fake nodes, named fake-node-<i>.
	// Default 1.
	Nodes int
	// Log gets progress lines; nil discards them.
	Log io.Writer
	// RealNode adds a real node (node.go): kubelet, containerd and runc
	// in a network namespace of their own, with kube-proxy and CoreDNS, so
	// that containers really run. The API server then listens on HostAddr
	// instead of 127.0.0.1, and the kwok nodes carry FakeNodeTaint so
	// that pods go to the real node unless they tolerate it. One real node
	// runs per machine at a time (Start waits for another to stop).
	RealNode bool
	// NodeBinDir holds the real node's binaries (EnsureNodeBuilt).
	// Required with RealNode.
	NodeBinDir string
	// NodeImages are images the real node's containerd imports before
	// Start returns (no registry is reachable).
	NodeImages []NodeImage
}

// Cluster is a running control plane: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and kwok, every listener on
// 127.0.0.1.
type Cluster struct {
	dir        string
	removeDir  bool
	kubeconfig string
	admin      *rest.Config
	client     *kubernetes.Clientset
	// procs in start order; Stop ends them in reverse.
	procs []*proc
	// stopBackground ends the goroutines of the cluster (the fake volume
	// provisioner).
	stopBackground context.CancelFunc
	// authority signs every certificate; pki is where they are written.
	authority *ca
	pki       string
	// apiHost is the address the API server listens on: 127.0.0.1, or
	// HostAddr with a real node.
	apiHost string
	apiPort int
	// node is the real node, nil without one.
	node *node

	stopOnce sync.Once
}

// ServiceCIDR is the cluster's service range: only data, nothing dials it.
const ServiceCIDR = "10.0.0.0/24"

// FakeNodeAnnotation marks the Nodes kwok plays.
const FakeNodeAnnotation = "kwok.x-k8s.io/node"

// FakeNodeTaint is on the kwok nodes of a cluster with a real node: a pod
// goes to the real node unless it tolerates this.
var FakeNodeTaint = corev1.Taint{Key: FakeNodeAnnotation, Value: "fake", Effect: corev1.TaintEffectNoSchedule}

// Start starts a cluster and returns when it is ready: the API server
// answers /readyz, every fake node is Ready and schedulable, the
// controller-manager has made the default ServiceAccount and the scheduler
// is healthy. On error nothing is left running.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.BinDir == "" {
		return nil, errors.New("kubetest: Options.BinDir is required")
	}
	if opts.Nodes <= 0 {
		opts.Nodes = 1
	}
	logw := opts.Log
	if logw == nil {
		logw = io.Discard
	}
	c := &Cluster{dir: opts.Dir}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "kubetest-"); err != nil {
			return nil, err
		}
		c.removeDir = true
	} else if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	start := time.Now()
	if err := c.start(ctx, opts, logw); err != nil {
		return nil, err
	}
	fmt.Fprintf(logw, "kubetest: cluster ready in %s (kubeconfig %s)\n", time.Since(start).Round(10*time.Millisecond), c.kubeconfig)
	return c, nil
}

// files written by start into the state directory.
type files struct {
	ca, saKey                           string
	apiCert, apiKey                     string
	kwokCert, kwokKey                   string
	kubeletClientCert, kubeletClientKey string
	admin, kcm, sched, kwokKC           string
}

func (c *Cluster) start(ctx context.Context, opts Options, logw io.Writer) error {
	bin := func(name string) string { return filepath.Join(opts.BinDir, name) }
	for _, b := range []string{binEtcd, binAPIServer, binController, binScheduler, binKwok} {
		if _, err := os.Stat(bin(b)); err != nil {
			return fmt.Errorf("kubetest: missing %s (build the binaries with `make cluster-bins`): %w", b, err)
		}
	}
	ports, err := freePorts(7)
	if err != nil {
		return err
	}
	etcdPort, peerPort, apiPort, kcmPort, schedPort, kwokPort := ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]
	c.apiHost, c.apiPort = "127.0.0.1", apiPort
	if opts.RealNode {
		// The node's network namespace first: the API server listens on
		// its host end.
		if c.node, err = prepareNode(ctx, c.dir, opts, logw); err != nil {
			return err
		}
		c.apiHost = HostAddr
	}
	f, err := c.writeFiles(apiPort)
	if err != nil {
		return fmt.Errorf("kubetest: write certificates: %w", err)
	}

	etcdURL := "http://127.0.0.1:" + itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + itoa(peerPort)
	etcd, err := startProc(c.dir, "etcd", bin(binEtcd),
		"--name=etcd0", "--data-dir="+filepath.Join(c.dir, "etcd-data"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=etcd0="+peerURL, "--unsafe-no-fsync", "--log-level=warn")
	if err != nil {
		return err
	}
	c.procs = append(c.procs, etcd)

	certDir := filepath.Join(c.dir, "serving")
	apiArgs := []string{"--etcd-servers=" + etcdURL,
		"--bind-address=" + c.apiHost, "--advertise-address=" + c.apiHost, "--secure-port=" + itoa(apiPort),
		"--tls-cert-file=" + f.apiCert, "--tls-private-key-file=" + f.apiKey,
		// Node: a kubelet reads only what its own pods need.
		"--client-ca-file=" + f.ca, "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + f.saKey, "--service-account-signing-key-file=" + f.saKey,
		"--kubelet-preferred-address-types=InternalIP", "--kubelet-certificate-authority=" + f.ca,
		"--kubelet-client-certificate=" + f.kubeletClientCert, "--kubelet-client-key=" + f.kubeletClientKey,
		"--allow-privileged=true", "--cert-dir=" + certDir}
	if c.node == nil {
		// The endpoint reconciler refuses a loopback advertise address;
		// with a real node it keeps default/kubernetes pointing at
		// HostAddr, where pods reach the API server through kube-proxy.
		apiArgs = append(apiArgs, "--endpoint-reconciler-type=none")
	}
	api, err := startProc(c.dir, "kube-apiserver", bin(binAPIServer), apiArgs...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, api)
	if err := c.waitReadyz(ctx); err != nil {
		return err
	}
	fmt.Fprintf(logw, "kubetest: kube-apiserver ready on %s:%d\n", c.apiHost, apiPort)

	kcm, err := startProc(c.dir, "kube-controller-manager", bin(binController),
		"--kubeconfig="+f.kcm, "--authentication-kubeconfig="+f.kcm, "--authorization-kubeconfig="+f.kcm,
		"--bind-address=127.0.0.1", "--secure-port="+itoa(kcmPort), "--cert-dir="+certDir,
		"--leader-elect=false",
		// Each controller acts with its own bootstrap role; the
		// controller-manager's own identity may not create pods.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+f.saKey, "--root-ca-file="+f.ca,
		"--controllers=*")
	if err != nil {
		return err
	}
	c.procs = append(c.procs, kcm)
	sched, err := startProc(c.dir, "kube-scheduler", bin(binScheduler),
		"--kubeconfig="+f.sched, "--authentication-kubeconfig="+f.sched, "--authorization-kubeconfig="+f.sched,
		"--bind-address=127.0.0.1", "--secure-port="+itoa(schedPort), "--cert-dir="+certDir,
		"--leader-elect=false")
	if err != nil {
		return err
	}
	c.procs = append(c.procs, sched)
	kwokConfig, err := c.writeKwokConfig(opts.BinDir, f, kwokPort)
	if err != nil {
		return err
	}
	kwok, err := startProc(c.dir, "kwok", bin(binKwok), "--kubeconfig="+f.kwokKC, "--config="+kwokConfig)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, kwok)

	if err := c.addNodes(ctx, opts.Nodes, opts.RealNode); err != nil {
		return err
	}
	if err := c.poll(ctx, "the default ServiceAccount (controller-manager)", func(ctx context.Context) (bool, error) {
		_, err := c.client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, ignoreNotFound(err)
	}); err != nil {
		return err
	}
	if err := c.poll(ctx, "kube-scheduler /healthz", func(ctx context.Context) (bool, error) {
		return healthy(ctx, schedPort), nil
	}); err != nil {
		return err
	}
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.stopBackground = cancel
	if err := c.provisionVolumes(bg); err != nil {
		return err
	}
	if c.node != nil {
		return c.node.start(ctx, c, opts, logw)
	}
	return nil
}

// writeFiles creates the certificates, the token signing key and a
// kubeconfig per client identity.
func (c *Cluster) writeFiles(apiPort int) (files, error) {
	var f files
	pki := filepath.Join(c.dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return f, err
	}
	authority, err := newCA()
	if err != nil {
		return f, err
	}
	c.authority, c.pki = authority, pki
	f.ca = filepath.Join(pki, "ca.crt")
	if err := os.WriteFile(f.ca, authority.pem, 0o600); err != nil {
		return f, err
	}
	saKey, err := newSigningKey()
	if err != nil {
		return f, err
	}
	f.saKey = filepath.Join(pki, "sa.key")
	if err := os.WriteFile(f.saKey, saKey, 0o600); err != nil {
		return f, err
	}
	server := func(name string, sans ...string) (string, string, error) {
		kp, err := authority.issue(name, nil, true, sans...)
		if err != nil {
			return "", "", err
		}
		return kp.write(pki, name)
	}
	// Pods reach the API server at the kubernetes Service's address and
	// names; with a real node, the host reaches it at HostAddr.
	if f.apiCert, f.apiKey, err = server("kube-apiserver", c.apiHost, ServiceCIDR[:strings.LastIndex(ServiceCIDR, ".")]+".1",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"); err != nil {
		return f, err
	}
	if f.kwokCert, f.kwokKey, err = server("kwok-serving"); err != nil {
		return f, err
	}
	server_ := "https://" + c.apiHost + ":" + itoa(apiPort)
	client := c.clientKubeconfig
	if f.admin, err = client("admin", "talkide-test-admin", "system:masters"); err != nil {
		return f, err
	}
	if f.kcm, err = client("kube-controller-manager", "system:kube-controller-manager"); err != nil {
		return f, err
	}
	if f.sched, err = client("kube-scheduler", "system:kube-scheduler"); err != nil {
		return f, err
	}
	if f.kwokKC, err = client("kwok", "kwok", "system:masters"); err != nil {
		return f, err
	}
	// The API server's identity towards kubelets (logs, exec).
	kp, err := authority.issue("kube-apiserver-kubelet-client", []string{"system:masters"}, false)
	if err != nil {
		return f, err
	}
	if f.kubeletClientCert, f.kubeletClientKey, err = kp.write(pki, "kube-apiserver-kubelet-client"); err != nil {
		return f, err
	}
	c.kubeconfig = f.admin
	ca, _ := os.ReadFile(f.ca)
	adminCert, _ := os.ReadFile(filepath.Join(pki, "admin.crt"))
	adminKey, _ := os.ReadFile(filepath.Join(pki, "admin.key"))
	c.admin = &rest.Config{
		Host:            server_,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca, CertData: adminCert, KeyData: adminKey},
		QPS:             200,
		Burst:           400,
	}
	c.client, err = kubernetes.NewForConfig(c.admin)
	return f, err
}

// clientKubeconfig issues a client certificate for user cn in groups orgs
// and writes a kubeconfig with it, <name>.kubeconfig in the state
// directory, returning its path.
func (c *Cluster) clientKubeconfig(name, cn string, orgs ...string) (string, error) {
	kp, err := c.authority.issue(cn, orgs, false)
	if err != nil {
		return "", err
	}
	cert, key, err := kp.write(c.pki, name)
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.dir, name+".kubeconfig")
	server := "https://" + c.apiHost + ":" + itoa(c.apiPort)
	return path, writeKubeconfig(path, server, filepath.Join(c.pki, "ca.crt"), cert, key, cn)
}

func writeKubeconfig(path, server, ca, cert, key, user string) error {
	s := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: talkide-test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: talkide-test
  context:
    cluster: talkide-test
    user: %s
current-context: talkide-test
`, server, ca, user, cert, key, user)
	return os.WriteFile(path, []byte(s), 0o600)
}

// writeKwokConfig writes kwok's configuration: its options, a log file
// every container "prints" (so pod logs stream through the API server), and
// the Stage manifests that make nodes Ready, pods Running and Job pods
// Succeeded at once.
func (c *Cluster) writeKwokConfig(binDir string, f files, port int) (string, error) {
	logsFile := filepath.Join(c.dir, "container.log")
	line := func(s string) string { return time.Now().UTC().Format(time.RFC3339Nano) + " stdout F " + s + "\n" }
	if err := os.WriteFile(logsFile, []byte(line(FakeLogLine)), 0o644); err != nil {
		return "", err
	}
	var b strings.Builder
	// With a config file kwok applies none of its parallelism defaults.
	fmt.Fprintf(&b, `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  cidr: 10.244.0.0/16
  nodeIP: 127.0.0.1
  nodePort: %d
  serverAddress: 127.0.0.1:%d
  tlsCertFile: %s
  tlsPrivateKeyFile: %s
  manageNodesWithAnnotationSelector: %s=fake
  enableDebuggingHandlers: true
  podPlayStageParallelism: 4
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 4
  enablePodsOnNodeSyncListPager: true
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterLogs
metadata:
  name: fixed-log
spec:
  logs:
  - logsFile: %s
`, port, port, f.kwokCert, f.kwokKey, FakeNodeAnnotation, logsFile)
	for _, s := range []string{
		"node/fast/node-initialize.yaml",
		"node/heartbeat/node-heartbeat.yaml",
		"pod/fast/pod-ready.yaml",
		"pod/fast/pod-complete.yaml",
		"pod/fast/pod-delete.yaml",
	} {
		y, err := os.ReadFile(filepath.Join(binDir, stagesDir, s))
		if err != nil {
			return "", fmt.Errorf("kubetest: kwok stage: %w", err)
		}
		if s == "pod/fast/pod-complete.yaml" {
			// A Job's pod labelled HoldLabel stays Running; one labelled
			// ExitLabel fails (failStage) instead of succeeding.
			y, err = holdable(y)
			if err != nil {
				return "", err
			}
		}
		b.WriteString("---\n")
		b.Write(y)
		if !strings.HasSuffix(string(y), "\n") {
			b.WriteString("\n")
		}
	}
	b.WriteString("---\n" + failStage)
	path := filepath.Join(c.dir, "kwok.yaml")
	return path, os.WriteFile(path, []byte(b.String()), 0o600)
}

// Labels a test puts on a Job's pod template to stage what its container
// does on a fake node: HoldLabel keeps it running (until the pod is
// deleted), ExitLabel makes it exit with status 1 (the pod Failed).
const (
	HoldLabel = "kubetest-hold"
	ExitLabel = "kubetest-exit"
)

// holdable adds to kwok's pod-complete Stage that it takes no pod labelled
// HoldLabel or ExitLabel.
func holdable(stage []byte) ([]byte, error) {
	const anchor = "    matchExpressions:\n"
	s := string(stage)
	if !strings.Contains(s, anchor) {
		return nil, errors.New("kubetest: kwok's pod-complete stage has no matchExpressions to extend")
	}
	extra := ""
	for _, l := range []string{HoldLabel, ExitLabel} {
		extra += "    - key: '.metadata.labels[\"" + l + "\"]'\n      operator: 'DoesNotExist'\n"
	}
	return []byte(strings.Replace(s, anchor, anchor+extra, 1)), nil
}

// failStage ends a running Job pod labelled ExitLabel: its containers
// exit with status 1 and the pod fails.
const failStage = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: kubetest-pod-fail
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.metadata.labels["` + ExitLabel + `"]'
      operator: 'Exists'
  next:
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range $index, $item := .spec.containers }}
      - image: {{ $item.image | Quote }}
        name: {{ $item.name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 1
            finishedAt: {{ $now | Quote }}
            reason: Error
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Failed
`

// FakeLogLine is what every container on a fake node has logged.
const FakeLogLine = "kubetest: fake container output"

// addNodes creates the fake nodes, waits until kwok reports them Ready and
// lifts the not-ready taint that admission put on them (only the
// node-lifecycle controller would, and not at once).
func (c *Cluster) addNodes(ctx context.Context, n int, taint bool) error {
	nodes := c.client.CoreV1().Nodes()
	for i := range n {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("fake-node-%d", i),
			Annotations: map[string]string{FakeNodeAnnotation: "fake"},
			Labels:      map[string]string{"type": "kwok", "kubernetes.io/hostname": fmt.Sprintf("fake-node-%d", i)},
		}}
		if taint {
			node.Spec.Taints = []corev1.Taint{FakeNodeTaint}
		}
		if _, err := nodes.Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("kubetest: create node: %w", err)
		}
	}
	for i := range n {
		name := fmt.Sprintf("fake-node-%d", i)
		if err := c.poll(ctx, "node "+name+" Ready and untainted", func(ctx context.Context) (bool, error) {
			node, err := nodes.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if !nodeReady(node) {
				return false, nil
			}
			var keep []corev1.Taint
			for _, t := range node.Spec.Taints {
				if t.Key != corev1.TaintNodeNotReady {
					keep = append(keep, t)
				}
			}
			if len(keep) == len(node.Spec.Taints) {
				return true, nil
			}
			node.Spec.Taints = keep
			_, err = nodes.Update(ctx, node, metav1.UpdateOptions{})
			return false, ignoreConflict(err)
		}); err != nil {
			return err
		}
	}
	return nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (c *Cluster) waitReadyz(ctx context.Context) error {
	return c.poll(ctx, "kube-apiserver /readyz", func(ctx context.Context) (bool, error) {
		body, err := c.client.RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
}

// healthy reports whether a component's HTTPS /healthz on port answers ok
// (its serving certificate is self-signed; only loopback is dialled).
func healthy(ctx context.Context, port int) bool {
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 2 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK && string(b) == "ok"
}

// poll calls cond every 50 ms until it reports done, returns an error, a
// component exits (its log's end is in the error), or a minute passes.
func (c *Cluster) poll(ctx context.Context, what string, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	for {
		for _, p := range c.procs {
			if err := p.exited(); err != nil {
				return fmt.Errorf("kubetest: waiting for %s: %w", what, err)
			}
		}
		done, err := cond(ctx)
		if done {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubetest: waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// Stop ends every component (SIGTERM to its process group, SIGKILL after
// a few seconds) and removes a temporary state directory. It is
// idempotent.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		if c.stopBackground != nil {
			c.stopBackground()
		}
		if c.node != nil {
			c.node.stopProcesses()
		}
		var wg sync.WaitGroup
		for _, p := range c.procs {
			wg.Go(func() { p.stop(5 * time.Second) })
		}
		wg.Wait()
		clean := true
		if c.node != nil {
			if err := c.node.cleanup(); err != nil {
				fmt.Fprintf(os.Stderr, "kubetest: the real node left something behind: %v\n", err)
				clean = false
			}
		}
		// Never a RemoveAll through a mount that is still there.
		if c.removeDir && clean {
			os.RemoveAll(c.dir)
		}
	})
}

// Kubeconfig is the path of an admin (system:masters) kubeconfig.
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// AdminConfig returns a copy of the admin's client configuration.
func (c *Cluster) AdminConfig() *rest.Config { return rest.CopyConfig(c.admin) }

// Client is the admin's clientset.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// TokenConfig returns a client configuration that authenticates with
// bearer token only (no client certificate).
func (c *Cluster) TokenConfig(token string) *rest.Config {
	cfg := rest.AnonymousClientConfig(c.admin)
	cfg.BearerToken = token
	return cfg
}
