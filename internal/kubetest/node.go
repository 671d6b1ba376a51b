package kubetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The real node's network: a network namespace the harness makes, joined
// to the host by a veth pair. The API server listens on the host's end;
// the kubelet, containerd, kube-proxy and CoreDNS run inside, and pods get
// addresses of PodCIDR on a bridge there. Test traffic stays between the
// host and this namespace: the namespace's default route leads to the
// host, which forwards nothing.
const (
	// NodeName is the real node's name.
	NodeName = "talkide-node"
	// HostAddr is the host's end of the veth pair: the API server, and
	// whatever a test serves to pods, listen there. The addresses are of
	// the benchmarking range (RFC 2544), which networks do not route;
	// prepareNode refuses to start when the machine uses them anyway.
	HostAddr = "198.18.77.1"
	// NodeAddr is the node's address (its InternalIP; CoreDNS answers on
	// port 53 there).
	NodeAddr = "198.18.77.2"
	// nodeNet is the veth pair's network.
	nodeNet = "198.18.77.0/24"
	// PodCIDR holds the real node's pod addresses (the kwok nodes use
	// 10.244.0.0/16). The host routes it, and ServiceCIDR, to the node.
	PodCIDR = "10.246.0.0/24"

	nodeNetns = "talkide-node"
	hostVeth  = "talkide-host"
	nodeVeth  = "eth0"
	cniBridge = "talkide-cni0"
	// nodeCgroupRoot is the kubelet's cgroup root in every hierarchy, so
	// that everything the node starts is found and removed under it.
	nodeCgroupRoot = "talkide-node"
	// nodeLock is an abstract unix socket: held while a real node runs on
	// this machine, gone with its process, no file left.
	nodeLock = "@talkide-kubetest-node"
	// RealNodeLabel is on the real node.
	RealNodeLabel = "talkide.dev/real-node"
	// nodeDirName names the node's state directory in the cluster's: a
	// crashed node's mounts are found by it wherever they are.
	nodeDirName = "talkide-node"
)

// hostPaths are paths outside the state directory that kubelet, containerd,
// CNI and `ip netns` use whatever is configured. Teardown removes what the
// node created in them.
var hostPaths = []string{"/run/containerd", "/var/lib/kubelet", "/var/log/containers", "/var/log/pods",
	"/var/lib/cni", "/run/netns", NodeHostUIDDir, "/etc/cni", "/opt/cni", "/var/lib/containerd"}

// NodeHostUIDDir is the node-wide agent uid claim directory (a hostPath)
// for the worker pods of tests on the real node: one of their own, which
// teardown removes, never the machine's own /run/talkide/uids that workers
// of other tests share.
const NodeHostUIDDir = "/run/talkide/kubetest-node-uids"

// kernelSysctls are the global settings kubelet changes at start (it
// "protects kernel defaults" by writing them); they are restored after it
// starts and at teardown.
var kernelSysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward"}

// NodeFeatures are what the real node's host gives pods, read once at
// start: a test names what it cannot check here instead of passing.
type NodeFeatures struct {
	// UserNamespaces: runc reports idmapped mounts, so the node runs
	// hostUsers: false pods.
	UserNamespaces bool
	// CgroupV2: the host runs the unified hierarchy (containerd's
	// cgroup_writable exists only there).
	CgroupV2 bool
	// NFTQueue: the kernel has nftables' queue, which
	// kube-network-policies needs to enforce NetworkPolicies.
	NFTQueue bool
	// FUSE: bindfs and /dev/fuse are there for the NFS stand-in
	// (StorageClassNoIdmap).
	FUSE bool
}

// node is the real node's processes and what teardown must undo.
type node struct {
	dir      string // <cluster dir>/node
	bins     string
	log      io.Writer
	lock     net.Listener
	features NodeFeatures
	// existed: for each host path, whether it existed before, and its
	// entries then.
	existed map[string][]string
	sysctls map[string]string
	// parentExisted: NodeHostUIDDir's parent existed before.
	parentExisted bool
	// before is the host's state before the node started; leftovers what
	// cleanup found changed, with the lock still held.
	before    hostState
	leftovers []string
	// procs in start order: containerd, kubelet, kube-proxy, coredns.
	procs []*proc
}

// prepareNode checks the machine, takes the machine's node lock, removes
// what a crashed earlier node left, records the host's state and makes
// the network namespace (the API server listens on its host end).
func prepareNode(ctx context.Context, clusterDir string, opts Options, log io.Writer) (_ *node, err error) {
	if opts.NodeBinDir == "" {
		return nil, errors.New("kubetest: Options.NodeBinDir is required with RealNode")
	}
	if miss := NodeRunMissing(); len(miss) > 0 {
		return nil, fmt.Errorf("kubetest: a real node needs %s (`make node-tools` installs the packages)", strings.Join(miss, "; "))
	}
	for _, b := range []string{binKubelet, binKubeProxy, binContainerd, binCtr, binShim, binRunc, binCoreDNS, pauseImage} {
		if _, err := os.Stat(filepath.Join(opts.NodeBinDir, b)); err != nil {
			return nil, fmt.Errorf("kubetest: missing the node's %s (build it with `make cluster-bins`): %w", b, err)
		}
	}
	n := &node{dir: filepath.Join(clusterDir, nodeDirName), bins: opts.NodeBinDir, log: log}
	if n.lock, err = lockNode(ctx); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.cleanup()
		}
	}()
	// The lock is ours: whatever a node left is stale.
	if err := removeStaleNode(); err != nil {
		return nil, err
	}
	// What teardown must leave, read while no node runs.
	n.before = readHostState()
	if err := checkNodeNetworks(); err != nil {
		return nil, err
	}
	n.features = readNodeFeatures(n.bins)
	n.existed = hostPathEntries()
	_, err = os.Stat(filepath.Dir(NodeHostUIDDir))
	n.parentExisted = err == nil
	n.sysctls = map[string]string{}
	for _, s := range kernelSysctls {
		b, err := os.ReadFile("/proc/sys/" + s)
		if err == nil {
			n.sysctls[s] = strings.TrimSpace(string(b))
		}
	}
	// Containers of pods in user namespaces start as unprivileged uids of
	// the node: their runtime must pass through the state directories to
	// their root filesystems. Secrets inside stay files of mode 0600.
	if err := os.Chmod(clusterDir, 0o711); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(n.dir, 0o711); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"netns", "add", nodeNetns},
		{"link", "add", hostVeth, "type", "veth", "peer", "name", nodeVeth, "netns", nodeNetns},
		{"addr", "add", HostAddr + "/24", "dev", hostVeth},
		{"link", "set", hostVeth, "up"},
		{"-n", nodeNetns, "addr", "add", NodeAddr + "/24", "dev", nodeVeth},
		{"-n", nodeNetns, "link", "set", nodeVeth, "up"},
		{"-n", nodeNetns, "link", "set", "lo", "up"},
		{"-n", nodeNetns, "route", "add", "default", "via", HostAddr},
		// The host reaches pods and Services through the node.
		{"route", "add", PodCIDR, "via", NodeAddr, "dev", hostVeth},
		{"route", "add", ServiceCIDR, "via", NodeAddr, "dev", hostVeth},
	}
	for _, s := range steps {
		if out, err := exec.CommandContext(ctx, "ip", s...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("kubetest: ip %s: %v: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return n, nil
}

// checkNodeNetworks refuses networks of the node that the machine already
// uses (an address or a route of it inside one of them): a node there would
// take over the machine's own traffic.
func checkNodeNetworks() error {
	var nets []*net.IPNet
	for _, c := range []string{nodeNet, PodCIDR, ServiceCIDR} {
		_, n, err := net.ParseCIDR(c)
		if err != nil {
			return err
		}
		nets = append(nets, n)
	}
	overlaps := func(ip net.IP, n *net.IPNet) bool { return n.Contains(ip) }
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return err
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		for _, n := range nets {
			if overlaps(ipn.IP, n) || ipn.Contains(n.IP) && !ipn.IP.IsLoopback() {
				return fmt.Errorf("kubetest: this machine's address %s lies in or holds the real node's network %s: the node would take over its traffic", ipn, n)
			}
		}
	}
	out, _ := exec.Command("ip", "-4", "route", "show", "table", "main").Output()
	for line := range strings.Lines(string(out)) {
		dst := strings.Fields(line)
		if len(dst) == 0 || dst[0] == "default" {
			continue
		}
		_, rn, err := net.ParseCIDR(dst[0])
		if err != nil {
			if ip := net.ParseIP(dst[0]); ip != nil {
				rn = &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}
			} else {
				continue
			}
		}
		for _, n := range nets {
			if n.Contains(rn.IP) || rn.Contains(n.IP) {
				return fmt.Errorf("kubetest: this machine routes %s, which overlaps the real node's network %s", strings.TrimSpace(line), n)
			}
		}
	}
	return nil
}

// NodeRunMissing names what this machine lacks to run a real node, one
// item each; empty when nothing is missing.
func NodeRunMissing() []string {
	var miss []string
	if os.Geteuid() != 0 {
		miss = append(miss, "root (a node runs containers, mounts and network namespaces)")
	}
	for _, c := range [][2]string{{"ip", "iproute2"}, {"nsenter", "util-linux"}, {"iptables", "iptables"},
		{"iptables-restore", "iptables"}, {"conntrack", "conntrack"}} {
		if _, err := exec.LookPath(c[0]); err != nil {
			miss = append(miss, fmt.Sprintf("the command %s (Debian package %s)", c[0], c[1]))
		}
	}
	return miss
}

// lockNode takes the machine's node lock, waiting up to 20 minutes for
// another node (another test package, `make cluster`) to stop.
func lockNode(ctx context.Context) (net.Listener, error) {
	// Test packages with a real node take turns: long enough for the
	// longest to finish.
	deadline := time.Now().Add(20 * time.Minute)
	said := false
	for {
		l, err := net.Listen("unix", nodeLock)
		if err == nil {
			return l, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("kubetest: another real node has run on this machine for 20 minutes (`make cluster`, or another test); one runs at a time: stop it with `make cluster-down` (lock %s)", nodeLock)
		}
		if !said {
			fmt.Fprintf(os.Stderr, "kubetest: waiting for the real node another process runs on this machine to stop (another test package, or `make cluster`)\n")
			said = true
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func readNodeFeatures(bins string) NodeFeatures {
	var f NodeFeatures
	if out, err := exec.Command(filepath.Join(bins, binRunc), "features").Output(); err == nil {
		// "idmap": {"enabled": true}
		s := strings.Join(strings.Fields(string(out)), "")
		f.UserNamespaces = strings.Contains(s, `"idmap":{"enabled":true`)
	}
	var st syscall.Statfs_t
	f.CgroupV2 = syscall.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == 0x63677270
	f.NFTQueue = kernelConfig("CONFIG_NFT_QUEUE")
	_, errBindfs := exec.LookPath("bindfs")
	_, errFuse := os.Stat("/dev/fuse")
	f.FUSE = errBindfs == nil && errFuse == nil
	return f
}

// kernelConfig reports whether the running kernel was built with option
// (=y or =m), from /proc/config.gz.
func kernelConfig(option string) bool {
	out, err := exec.Command("sh", "-c", "zcat /proc/config.gz 2>/dev/null || cat /boot/config-$(uname -r)").Output()
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(out)) {
		if strings.HasPrefix(line, option+"=y") || strings.HasPrefix(line, option+"=m") {
			return true
		}
	}
	return false
}

// start starts containerd, imports the images, starts the kubelet and
// waits for the node to be Ready, then kube-proxy and CoreDNS.
func (n *node) start(ctx context.Context, c *Cluster, opts Options, log io.Writer) error {
	t0 := time.Now()
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	busybox := filepath.Join(n.dir, "busybox.tar")
	if err := writeBusyboxImage(busybox); err != nil {
		return err
	}
	images := append([]NodeImage{{Archive: filepath.Join(n.bins, pauseImage)}, {Archive: busybox}}, opts.NodeImages...)
	for _, img := range images {
		if err := n.importImage(ctx, img); err != nil {
			return err
		}
	}
	if err := n.makeCgroupRoot(); err != nil {
		return err
	}
	if err := n.startKubelet(ctx, c); err != nil {
		return err
	}
	if err := c.poll(ctx, "the real node "+NodeName+" Ready", func(ctx context.Context) (bool, error) {
		if err := n.exited(); err != nil {
			return false, err
		}
		node, err := c.client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, ignoreNotFound(err)
		}
		return nodeReady(node), nil
	}); err != nil {
		return err
	}
	n.restoreSysctls()
	if err := n.fencePods(c.apiPort); err != nil {
		return err
	}
	if err := n.startProxyAndDNS(ctx, c); err != nil {
		return err
	}
	fmt.Fprintf(log, "kubetest: real node %s Ready in %s (%+v)\n", NodeName, time.Since(t0).Round(10*time.Millisecond), n.features)
	return nil
}

// exited reports a node process that has exited.
func (n *node) exited() error {
	for _, p := range n.procs {
		if err := p.exited(); err != nil {
			return err
		}
	}
	return nil
}

// inNode starts a process of the node in its network namespace (and the
// host's mount namespace, which the kubelet and containerd must share).
func (n *node) inNode(name, bin string, env []string, args ...string) error {
	full := append([]string{"--net=/run/netns/" + nodeNetns, "--", bin}, args...)
	p, err := startProcEnv(n.dir, name, "nsenter", env, full...)
	if err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	return nil
}

func (n *node) containerdSock() string { return filepath.Join(n.dir, "containerd", "containerd.sock") }

func (n *node) startContainerd(ctx context.Context) error {
	d := func(p ...string) string { return filepath.Join(append([]string{n.dir}, p...)...) }
	for _, p := range []string{d("containerd"), d("cni", "net.d"), d("cni", "ipam")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	conflist := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "talkide-node",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, cniBridge, d("cni", "ipam"), PodCIDR)
	if err := os.WriteFile(d("cni", "net.d", "10-talkide.conflist"), []byte(conflist), 0o644); err != nil {
		return err
	}
	// restrict_oom_score_adj: a root without CAP_SYS_RESOURCE (some VMs)
	// cannot give the kubelet's sandboxes the oom_score_adj it asks for.
	cfg := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  level = "info"
[metrics]
  address = ""
[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = %[5]q
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %[6]q
  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = %[7]q
          SystemdCgroup = false
          Root = %[8]q
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%[9]q]
      conf_dir = %[10]q
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
`, d("containerd", "root"), d("containerd", "state"), n.containerdSock(), n.containerdSock()+".ttrpc",
		d("containerd", "opt"), PauseImageRef, filepath.Join(n.bins, binRunc), d("containerd", "runc"),
		filepath.Join(n.bins, cniDir), d("cni", "net.d"))
	if err := os.WriteFile(d("containerd.toml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	env := []string{"PATH=" + n.bins + ":" + os.Getenv("PATH")}
	if err := n.inNode("containerd", filepath.Join(n.bins, binContainerd), env, "--config", d("containerd.toml")); err != nil {
		return err
	}
	return pollFor(ctx, "containerd's socket", func() (bool, error) {
		if err := n.exited(); err != nil {
			return false, err
		}
		_, err := n.ctr(ctx, nil, "version")
		return err == nil, nil
	})
}

// ctr runs containerd's client against the node's containerd, in the
// Kubernetes namespace, with stdin when given.
func (n *node) ctr(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(n.bins, binCtr), append([]string{"--address", n.containerdSock(), "-n", "k8s.io"}, args...)...)
	cmd.Stdin = stdin
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// NodeImage is an image the real node's containerd imports (no registry
// is reachable): an archive (`docker save` or an OCI archive, named by its
// own tags), or an OCI image layout directory, which pods then name by
// digest as Repository@sha256:<manifest digest>.
type NodeImage struct {
	Archive string
	// Layout and Repository: an OCI image layout (`make images`'
	// .cache/images/oci/<name>/) and the repository pods name it with.
	Layout, Repository string
}

func (n *node) importImage(ctx context.Context, img NodeImage) error {
	if img.Archive != "" {
		f, err := os.Open(img.Archive)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = n.ctr(ctx, f, "images", "import", "--no-unpack=false", "-")
		return err
	}
	// An OCI layout streamed as an archive, named by its tag under
	// Repository; then also Repository@<manifest digest>, as `make
	// images` printed it and pods name it.
	digest, err := LayoutDigest(img.Layout)
	if err != nil {
		return err
	}
	r, w := io.Pipe()
	go func() { w.CloseWithError(tarDir(w, img.Layout)) }()
	_, err = n.ctr(ctx, r, "images", "import", "--base-name", img.Repository, "-")
	r.Close()
	if err != nil {
		return err
	}
	out, err := n.ctr(ctx, nil, "images", "ls")
	if err != nil {
		return err
	}
	for line := range strings.Lines(out) {
		// REF TYPE DIGEST SIZE PLATFORMS LABELS
		if f := strings.Fields(line); len(f) > 2 && f[2] == digest && strings.HasPrefix(f[0], img.Repository+":") {
			_, err := n.ctr(ctx, nil, "images", "tag", "--force", f[0], img.Repository+"@"+digest)
			return err
		}
	}
	return fmt.Errorf("kubetest: the import of %s made no image %s of manifest %s:\n%s", img.Layout, img.Repository, digest, out)
}

// cgroupMountpoints lists the mount points of every cgroup hierarchy (v1
// controllers and named hierarchies, and the unified one).
func cgroupMountpoints() []string {
	var out []string
	for _, m := range mountinfo() {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			out = append(out, m.point)
		}
	}
	return out
}

// makeCgroupRoot makes the kubelet's cgroup root in every hierarchy (it
// must exist); cpuset's gets its parent's CPUs and memory nodes.
func (n *node) makeCgroupRoot() error {
	for _, mnt := range cgroupMountpoints() {
		dir := filepath.Join(mnt, nodeCgroupRoot)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("kubetest: make the node's cgroup root: %w", err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(mnt, f)); err == nil {
				if cur, _ := os.ReadFile(filepath.Join(dir, f)); len(strings.TrimSpace(string(cur))) == 0 {
					_ = os.WriteFile(filepath.Join(dir, f), b, 0)
				}
			}
		}
	}
	return nil
}

func (n *node) startKubelet(ctx context.Context, c *Cluster) error {
	d := func(p ...string) string { return filepath.Join(append([]string{n.dir}, p...)...) }
	kp, err := c.authority.issue(NodeName, nil, true, NodeAddr, NodeName)
	if err != nil {
		return err
	}
	servingCert, servingKey, err := kp.write(c.pki, "kubelet-serving")
	if err != nil {
		return err
	}
	kubeconfig, err := c.clientKubeconfig("kubelet", "system:node:"+NodeName, "system:nodes")
	if err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
containerRuntimeEndpoint: unix://%s
imageServiceEndpoint: unix://%s
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: %s
tlsPrivateKeyFile: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %s}
authorization:
  mode: AlwaysAllow
clusterDNS: [%s]
clusterDomain: cluster.local
podLogsDir: %s
staticPodPath: ""
failSwapOn: false
protectKernelDefaults: false
makeIPTablesUtilChains: false
serializeImagePulls: false
evictionHard: {"nodefs.available": "1%%", "imagefs.available": "1%%", "memory.available": "100Mi"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 30
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
registerNode: true
resolvConf: /etc/resolv.conf
`, nodeCgroupRoot, n.containerdSock(), n.containerdSock(), NodeAddr, servingCert, servingKey,
		filepath.Join(c.pki, "ca.crt"), NodeAddr, d("pod-logs"))
	if err := os.WriteFile(d("kubelet.yaml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	return n.inNode("kubelet", filepath.Join(n.bins, binKubelet), nil,
		"--config="+d("kubelet.yaml"), "--kubeconfig="+kubeconfig,
		"--root-dir="+d("kubelet"), "--cert-dir="+d("kubelet-pki"),
		"--hostname-override="+NodeName, "--node-ip="+NodeAddr,
		"--node-labels="+RealNodeLabel+"=true", "--v=1")
}

func (n *node) startProxyAndDNS(ctx context.Context, c *Cluster) error {
	d := func(p ...string) string { return filepath.Join(append([]string{n.dir}, p...)...) }
	proxyKC, err := c.clientKubeconfig("kube-proxy", "system:kube-proxy")
	if err != nil {
		return err
	}
	// iptables mode in the node's namespace; masqueradeAll, so a pod that
	// reaches a Service backed by a pod on the same bridge gets the answer
	// through the node (no br_netfilter needed); no conntrack sysctls
	// (global ones are not the node's to change).
	proxyCfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
mode: iptables
hostnameOverride: %s
bindAddress: %s
healthzBindAddress: %s:10256
metricsBindAddress: 127.0.0.1:10249
clusterCIDR: %s
iptables:
  masqueradeAll: true
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, proxyKC, NodeName, NodeAddr, NodeAddr, PodCIDR)
	if err := os.WriteFile(d("kube-proxy.yaml"), []byte(proxyCfg), 0o644); err != nil {
		return err
	}
	if err := n.inNode("kube-proxy", filepath.Join(n.bins, binKubeProxy), nil, "--config="+d("kube-proxy.yaml"), "--v=1"); err != nil {
		return err
	}
	dnsKC, err := c.clientKubeconfig("coredns", "talkide-test-coredns", "system:masters")
	if err != nil {
		return err
	}
	corefile := fmt.Sprintf(`.:53 {
    bind %[1]s
    errors
    health %[1]s:8180
    ready %[1]s:8181
    cache 5
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig %[2]s
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    template ANY ANY {
        rcode NXDOMAIN
    }
}
`, NodeAddr, dnsKC)
	if err := os.WriteFile(d("Corefile"), []byte(corefile), 0o644); err != nil {
		return err
	}
	if err := n.inNode("coredns", filepath.Join(n.bins, binCoreDNS), nil, "-conf", d("Corefile")); err != nil {
		return err
	}
	client := &http.Client{Timeout: 2 * time.Second}
	ok := func(url string) bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	return pollFor(ctx, "kube-proxy's and CoreDNS's health", func() (bool, error) {
		if err := n.exited(); err != nil {
			return false, err
		}
		return ok("http://"+NodeAddr+":10256/healthz") && ok("http://"+NodeAddr+":8181/ready"), nil
	})
}

// podEgressChain holds what pods may reach outside the node: their replies,
// and the ports of the host's end that AllowPodsToHost opened (the API
// server's first); everything else leaving the node from a pod is
// refused, so an agent in a test's pod reaches none of the machine's own
// services, whatever address they listen on.
const podEgressChain = "TALKIDE-POD-EGRESS"

// iptables runs iptables in the node's network namespace.
func (n *node) iptables(args ...string) error {
	full := append([]string{"--net=/run/netns/" + nodeNetns, "--", "iptables", "-w"}, args...)
	if out, err := exec.Command("nsenter", full...).CombinedOutput(); err != nil {
		return fmt.Errorf("kubetest: iptables %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// fencePods makes podEgressChain, opening apiPort on the host's end.
func (n *node) fencePods(apiPort int) error {
	for _, r := range [][]string{
		{"-N", podEgressChain},
		{"-A", podEgressChain, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"},
		{"-A", podEgressChain, "-d", HostAddr, "-p", "tcp", "--dport", itoa(apiPort), "-j", "ACCEPT"},
		{"-A", podEgressChain, "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"},
		{"-I", "FORWARD", "1", "-s", PodCIDR, "-o", nodeVeth, "-j", podEgressChain},
	} {
		if err := n.iptables(r...); err != nil {
			return err
		}
	}
	return nil
}

// AllowPodsToHost lets the real node's pods reach TCP port on HostAddr
// (a test's control plane, or the development upstream, listening there);
// pods reach no other port of the host.
func (c *Cluster) AllowPodsToHost(port int) error {
	if c.node == nil {
		return errors.New("kubetest: no real node")
	}
	return c.node.iptables("-I", podEgressChain, "2", "-d", HostAddr, "-p", "tcp", "--dport", itoa(port), "-j", "ACCEPT")
}

// restoreSysctls puts back the global settings the kubelet changed.
func (n *node) restoreSysctls() {
	for k, v := range n.sysctls {
		if cur, err := os.ReadFile("/proc/sys/" + k); err == nil && strings.TrimSpace(string(cur)) != v {
			_ = os.WriteFile("/proc/sys/"+k, []byte(v), 0)
		}
	}
}

// stopProcesses ends the node: the kubelet first (so it restarts nothing),
// every process of its pods, the shims, containerd, kube-proxy and CoreDNS.
func (n *node) stopProcesses() {
	for i := len(n.procs) - 1; i >= 0; i-- {
		if n.procs[i].name == "kubelet" {
			n.procs[i].stop(5 * time.Second)
		}
	}
	killNodeProcesses(n.bins)
	for i := len(n.procs) - 1; i >= 0; i-- {
		n.procs[i].stop(5 * time.Second)
	}
	killNodeProcesses(n.bins)
}

// cleanup removes everything the node made outside its binaries: mounts,
// cgroups, the network namespace with its links and rules, what it made in
// the fixed host paths, and restores the sysctls; then it releases the
// machine's node lock. It returns what it could not remove.
func (n *node) cleanup() error {
	var errs []error
	if err := removeStaleNode(); err != nil {
		errs = append(errs, err)
	}
	for p, before := range n.existed {
		entries, _ := os.ReadDir(p)
		for _, e := range entries {
			if !slices.Contains(before, e.Name()) {
				if err := os.RemoveAll(filepath.Join(p, e.Name())); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	for _, p := range hostPaths {
		if _, had := n.existed[p]; !had && n.existed != nil {
			// `ip netns add` makes /run/netns a mount of its own.
			for _, m := range mountinfo() {
				if m.point == p {
					_ = syscall.Unmount(p, syscall.MNT_DETACH)
				}
			}
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, err)
			}
			// The kubelet made its parent too when it was missing: gone
			// when nothing else is in it.
			if p == NodeHostUIDDir && !n.parentExisted {
				_ = syscall.Rmdir(filepath.Dir(p))
			}
		}
	}
	n.restoreSysctls()
	// Checked before the lock goes: then no other node has started.
	if n.before.sysctls != nil {
		n.leftovers = n.before.diff(readHostState())
	}
	if n.lock != nil {
		n.lock.Close()
	}
	return errors.Join(errs...)
}

// nodeMount reports whether a mount point is a real node's: under a node
// state directory (wherever its cluster's is) or a fixed host path (but
// not the network namespace's own, which `ip netns del` removes).
func nodeMount(point string) bool {
	if strings.HasPrefix(point, "/run/netns/") {
		return false
	}
	if strings.Contains(point+"/", "/"+nodeDirName+"/") {
		return true
	}
	for _, p := range []string{"/run/containerd", "/var/lib/kubelet", NodeHostUIDDir} {
		if point == p || strings.HasPrefix(point, p+"/") {
			return true
		}
	}
	return false
}

// removeStaleNode removes a real node's processes, mounts, cgroups and
// network namespace, whoever started it.
func removeStaleNode() error {
	killNodeProcesses("")
	var errs []error
	// Deepest first; again while stacked mounts appear.
	for range 5 {
		var points []string
		for _, m := range mountinfo() {
			if nodeMount(m.point) {
				points = append(points, m.point)
			}
		}
		if len(points) == 0 {
			break
		}
		slices.SortFunc(points, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
		for _, p := range points {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
			}
		}
	}
	for _, mnt := range cgroupMountpoints() {
		if err := removeCgroupTree(filepath.Join(mnt, nodeCgroupRoot)); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := os.Stat("/run/netns/" + nodeNetns); err == nil {
		if out, err := exec.Command("ip", "netns", "del", nodeNetns).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns del %s: %v: %s", nodeNetns, err, out))
		}
	}
	// A veth whose namespace was gone with a process still in it.
	if _, err := net.InterfaceByName(hostVeth); err == nil {
		_ = exec.Command("ip", "link", "del", hostVeth).Run()
	}
	return errors.Join(errs...)
}

// killNodeProcesses SIGKILLs, until none is left (10 s at most), every
// process in the node's cgroups or network namespace, and every process
// whose program lies in bins (containerd's shims leave their parent).
func killNodeProcesses(bins string) {
	netns := ""
	if fi, err := os.Stat("/run/netns/" + nodeNetns); err == nil {
		netns = fmt.Sprint(fi.Sys().(*syscall.Stat_t).Ino)
	}
	for range 100 {
		pids := nodeProcesses(bins, netns)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func nodeProcesses(bins, netnsIno string) []int {
	self := os.Getpid()
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if _, rest, _ := strings.Cut(string(st), ") "); strings.HasPrefix(rest, "Z") {
				continue // exited, not yet reaped
			}
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		match := strings.Contains(string(cg), "/"+nodeCgroupRoot+"/") || strings.Contains(string(cg), ":/"+nodeCgroupRoot+"\n")
		if !match && netnsIno != "" {
			if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && l == "net:["+netnsIno+"]" {
				match = true
			}
		}
		if !match && bins != "" {
			if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && strings.HasPrefix(exe, bins+"/") {
				match = true
			}
		}
		if !match {
			if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && filepath.Base(exe) == binShim {
				match = true
			}
		}
		if match {
			pids = append(pids, pid)
		}
	}
	return pids
}

// removeCgroupTree removes dir and every group below it, deepest first.
func removeCgroupTree(dir string) error {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var last error
	for i := len(dirs) - 1; i >= 0; i-- {
		for try := 0; ; try++ {
			err := syscall.Rmdir(dirs[i])
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if try == 50 {
				last = fmt.Errorf("remove cgroup %s: %w", dirs[i], err)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return last
}

// mount is one line of /proc/self/mountinfo.
type mount struct{ point, fstype, source string }

func mountinfo() []mount {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+2 >= len(fields) {
			continue
		}
		out = append(out, mount{point: unescapeMount(fields[4]), fstype: fields[sep+1], source: fields[sep+2]})
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// pollFor calls cond every 100 ms until it is done, fails, or a minute
// passes.
func pollFor(ctx context.Context, what string, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		done, err := cond()
		if err != nil {
			return fmt.Errorf("kubetest: waiting for %s: %w", what, err)
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubetest: waiting for %s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// makeVolume makes the directory of a volume on the real node and returns
// its path; noIdmap makes it a bindfs mount of a backing directory beside
// it (a FUSE filesystem, which refuses idmapped mounts as NFS does).
func (n *node) makeVolume(id string, noIdmap bool) (string, error) {
	// Open to every uid, as NFS provisioners make them (the
	// nfs-subdir-external-provisioner's are 0777): a pod of any user may
	// use its volume.
	dir := filepath.Join(n.dir, "volumes", id)
	if err := mkdirMode(dir, 0o777); err != nil {
		return "", err
	}
	if !noIdmap {
		return dir, nil
	}
	backing := dir + ".backing"
	if err := mkdirMode(backing, 0o777); err != nil {
		return "", err
	}
	if out, err := exec.Command("bindfs", "-o", "allow_other,dev,suid", backing, dir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("bindfs %s: %v: %s", dir, err, out)
	}
	return dir, nil
}

// mkdirMode makes dir (and its parents) and gives it mode, whatever the
// umask.
func mkdirMode(dir string, mode os.FileMode) error {
	if err := os.MkdirAll(dir, mode); err != nil {
		return err
	}
	return os.Chmod(dir, mode)
}

// ImportImage imports img into the real node of the cluster whose state
// directory is clusterDir (a cluster `make cluster` runs, from another
// process), with the node binaries of nodeBins.
func ImportImage(ctx context.Context, clusterDir, nodeBins string, img NodeImage) error {
	n := &node{dir: filepath.Join(clusterDir, nodeDirName), bins: nodeBins}
	if _, err := os.Stat(n.containerdSock()); err != nil {
		return fmt.Errorf("kubetest: no real node runs in %s: %w", clusterDir, err)
	}
	return n.importImage(ctx, img)
}

// removeVolume unmounts and removes a volume makeVolume made.
func (n *node) removeVolume(dir string) {
	if !strings.HasPrefix(dir, filepath.Join(n.dir, "volumes")+"/") {
		return
	}
	_ = syscall.Unmount(dir, syscall.MNT_DETACH)
	// Only once nothing is mounted there: never a RemoveAll through a mount.
	for _, m := range mountinfo() {
		if m.point == dir {
			return
		}
	}
	os.RemoveAll(dir)
	os.RemoveAll(dir + ".backing")
}

// TeardownLeftovers lists what the real node's teardown (Stop) left on the
// host that was not there before it started: processes, mounts, cgroups,
// links, routes, rules, sysctls, host paths. Empty when it left nothing,
// and without a real node.
func (c *Cluster) TeardownLeftovers() []string {
	if c.node == nil {
		return nil
	}
	return c.node.leftovers
}

// Node reports the real node's features; ok is false without a real node.
func (c *Cluster) Node() (f NodeFeatures, ok bool) {
	if c.node == nil {
		return NodeFeatures{}, false
	}
	return c.node.features, true
}

// NodeDir is the real node's state directory (its components' logs are
// <name>.log there), "" without one.
func (c *Cluster) NodeDir() string {
	if c.node == nil {
		return ""
	}
	return c.node.dir
}

// ImportImage imports img into the real node's containerd.
func (c *Cluster) ImportImage(ctx context.Context, img NodeImage) error {
	if c.node == nil {
		return errors.New("kubetest: no real node")
	}
	return c.node.importImage(ctx, img)
}

// ClusterDNS is a resolver that asks the cluster's DNS (CoreDNS on the
// real node) for every name: a process on the host then resolves Service
// names (x.ns.svc.cluster.local) as a pod does. Other names fail, but
// those of /etc/hosts (localhost). Nil without a real node.
func (c *Cluster) ClusterDNS() *net.Resolver {
	if c.node == nil {
		return nil
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(NodeAddr, "53"))
	}}
}

// ContainerPID is the host pid of the init process of the container named
// name of pod, which runs on the real node (its task, as containerd knows
// it).
func (c *Cluster) ContainerPID(ctx context.Context, pod *corev1.Pod, name string) (int, error) {
	if c.node == nil {
		return 0, errors.New("kubetest: no real node")
	}
	var id string
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == name {
			_, id, _ = strings.Cut(s.ContainerID, "://")
		}
	}
	if id == "" {
		return 0, fmt.Errorf("kubetest: pod %s has no container %s with an id", pod.Name, name)
	}
	out, err := c.node.ctr(ctx, nil, "tasks", "ls")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("kubetest: no task of container %s in containerd:\n%s", id, out)
}

// NodeLeftovers lists what the real node still holds of the pods podUIDs
// and of the volume directory volume: containers and sandboxes, the
// kubelet's pod directories, cgroups, mounts, the volume. Empty when
// nothing is left.
func (c *Cluster) NodeLeftovers(ctx context.Context, podUIDs []string, volume string) []string {
	if c.node == nil {
		return []string{"no real node"}
	}
	var left []string
	for _, uid := range podUIDs {
		// Sandboxes are containers too, labelled the same.
		if out, err := c.node.ctr(ctx, nil, "containers", "ls", "-q", `labels."io.kubernetes.pod.uid"==`+uid); err != nil || strings.TrimSpace(out) != "" {
			left = append(left, fmt.Sprintf("containers of pod %s: %q %v", uid, strings.TrimSpace(out), err))
		}
		if _, err := os.Stat(filepath.Join(c.node.dir, "kubelet", "pods", uid)); err == nil {
			left = append(left, "the kubelet's directory of pod "+uid)
		}
		cgName := "pod" + uid
		for _, mnt := range cgroupMountpoints() {
			_ = filepath.WalkDir(filepath.Join(mnt, nodeCgroupRoot), func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() && filepath.Base(p) == cgName {
					left = append(left, "cgroup "+p)
					return filepath.SkipDir
				}
				return nil
			})
		}
		for _, m := range mountinfo() {
			if strings.Contains(m.point, uid) {
				left = append(left, "mount "+m.point)
			}
		}
	}
	if volume != "" {
		if _, err := os.Stat(volume); err == nil {
			left = append(left, "the session volume's directory "+volume)
		}
	}
	return left
}
