package kubetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"golang.org/x/sys/unix"
)

// busyboxPod is a pod of BusyboxImage running script.
func busyboxPod(name, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{Name: "main", Image: BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", script}}},
		},
	}
}

// waitPod waits until cond holds for the pod, up to two minutes; on
// timeout the error holds the pod's status and events.
func waitPod(t *testing.T, c *Cluster, ns, name string, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for {
		p, err := c.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && cond(p) {
			return p
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s/%s: not %s in 2 minutes: %v\n%s", ns, name, what, err, c.describePod(ns, name))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// describePod is the pod's status and events, for a failure message.
func (c *Cluster) describePod(ns, name string) string {
	ctx := context.Background()
	var b strings.Builder
	if p, err := c.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
		fmt.Fprintf(&b, "phase %s", p.Status.Phase)
		for _, s := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, "; container %s: %+v", s.Name, s.State)
		}
	}
	evs, _ := c.Client().CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if evs != nil {
		for _, e := range evs.Items {
			fmt.Fprintf(&b, "\nevent %s %s: %s", e.Type, e.Reason, e.Message)
		}
	}
	return b.String()
}

func running(p *corev1.Pod) bool {
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Running == nil {
			return false
		}
	}
	return p.Status.Phase == corev1.PodRunning
}

func (c *Cluster) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	bin := filepath.Join(BinDir(mustRoot(t), Pinned()), binKubectl)
	out, err := exec.CommandContext(t.Context(), bin, append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func mustRoot(t *testing.T) string {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestRealNodeRunsPods: the real node joins the cluster beside the kwok
// nodes with containerd as its runtime; a pod there really runs (its log
// and exec work), resolves Service names through CoreDNS and reaches the
// API server through the kubernetes Service (kube-proxy).
func TestRealNodeRunsPods(t *testing.T) {
	c := SharedNode(t)
	ctx := t.Context()
	node, err := c.Client().CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rt := node.Status.NodeInfo.ContainerRuntimeVersion; rt != "containerd://"+Pinned().Containerd {
		t.Errorf("runtime %q, want containerd://%s", rt, Pinned().Containerd)
	}
	wide := c.kubectl(t, "get", "nodes", "-o", "wide")
	if !strings.Contains(wide, "containerd://") || !strings.Contains(wide, "fake-node-0") {
		t.Errorf("kubectl get nodes -o wide shows no real node beside the kwok one:\n%s", wide)
	}
	ns := c.Namespace(t)
	pod := busyboxPod("probe", `echo started; nslookup kubernetes.default.svc.cluster.local; `+
		`if nc -w 5 kubernetes.default.svc.cluster.local 443 </dev/null; then echo api-reachable; fi; exec sleep 3600`)
	if _, err := c.Client().CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPod(t, c, ns, "probe", "running", running)
	if p.Spec.NodeName != NodeName {
		t.Fatalf("scheduled on %s, want the real node", p.Spec.NodeName)
	}
	var logs string
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && !strings.Contains(logs, "api-reachable") {
		b, _ := c.Client().CoreV1().Pods(ns).GetLogs("probe", &corev1.PodLogOptions{}).DoRaw(ctx)
		logs = string(b)
		time.Sleep(200 * time.Millisecond)
	}
	svcIP := ServiceCIDR[:strings.LastIndex(ServiceCIDR, ".")] + ".1"
	for _, want := range []string{"started", svcIP, "api-reachable"} {
		if !strings.Contains(logs, want) {
			t.Errorf("pod log lacks %q:\n%s", want, logs)
		}
	}
	if out := c.kubectl(t, "-n", ns, "exec", "probe", "--", "id", "-u"); strings.TrimSpace(out) != "0" {
		t.Errorf("exec id -u: %q", out)
	}

	// Pods reach the host only on the ports opened to them, on no other
	// address of the host: a service of the machine listening on every
	// address is out of their reach.
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Write([]byte("host-service\n"))
			conn.Close()
		}
	}()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	reach := func(addr string) string {
		out, _ := exec.CommandContext(ctx, filepath.Join(BinDir(mustRoot(t), Pinned()), binKubectl), "--kubeconfig", c.Kubeconfig(),
			"-n", ns, "exec", "probe", "--", "nc", "-w", "3", addr, port).CombinedOutput()
		return string(out)
	}
	addrs := []string{HostAddr}
	if other := otherHostAddr(); other != "" {
		addrs = append(addrs, other)
	}
	for _, a := range addrs {
		if out := reach(a); strings.Contains(out, "host-service") {
			t.Errorf("a pod reached the host's service on %s:%s, which no test opened", a, port)
		}
	}
	if err := c.AllowPodsToHost(ln.Addr().(*net.TCPAddr).Port); err != nil {
		t.Fatal(err)
	}
	if out := reach(HostAddr); !strings.Contains(out, "host-service") {
		t.Errorf("a pod did not reach the port opened to it: %q", out)
	}
	if len(addrs) > 1 {
		if out := reach(addrs[1]); strings.Contains(out, "host-service") {
			t.Errorf("a pod reached the opened port on the host's other address %s", addrs[1])
		}
	}
}

// otherHostAddr is an IPv4 address of the machine other than loopback and
// the node's host end, or "".
func otherHostAddr() string {
	as, _ := net.InterfaceAddrs()
	for _, a := range as {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && ipn.IP.String() != HostAddr {
			return ipn.IP.String()
		}
	}
	return ""
}

// TestRealNodeUserNamespacePod: a pod with hostUsers: false runs in a user
// namespace of its own (its root is an unprivileged uid on the node).
func TestRealNodeUserNamespacePod(t *testing.T) {
	c := SharedNode(t)
	if f, _ := c.Node(); !f.UserNamespaces {
		t.Fatal("this machine's runc reports no idmapped mounts: the node cannot run hostUsers: false pods")
	}
	ns := c.Namespace(t)
	pod := busyboxPod("userns", "cat /proc/self/uid_map; exec sleep 3600")
	pod.Spec.HostUsers = ptr.To(false)
	if _, err := c.Client().CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, c, ns, "userns", "running", running)
	out := c.kubectl(t, "-n", ns, "exec", "userns", "--", "cat", "/proc/self/uid_map")
	f := strings.Fields(out)
	if len(f) != 3 || f[0] != "0" || f[1] == "0" || f[2] != "65536" {
		t.Errorf("uid_map %q: want 0 <host uid, not 0> 65536", out)
	}
}

// TestRealNodeRunsJob: the real Job controller's pod runs to completion on
// the real node.
func TestRealNodeRunsJob(t *testing.T) {
	c := SharedNode(t)
	ctx := t.Context()
	ns := c.Namespace(t)
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "once"}, Spec: batchv1.JobSpec{
		BackoffLimit: ptr.To[int32](0),
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", "echo job-ran"}}}}},
	}}
	if _, err := c.Client().BatchV1().Jobs(ns).Create(ctx, j, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		j, err := c.Client().BatchV1().Jobs(ns).Get(ctx, "once", metav1.GetOptions{})
		if err == nil && j.Status.Succeeded == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job not complete in 2 minutes: %+v", j.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out := c.kubectl(t, "-n", ns, "logs", "job/once"); strings.TrimSpace(out) != "job-ran" {
		t.Errorf("job log %q", out)
	}
}

// TestNoIdmapVolumeStandsInForNFS: StorageClassNoIdmap's volumes refuse an
// idmapped mount as NFS does (mount_setattr fails with EINVAL), so a
// hostUsers: false pod cannot start with one while a hostUsers: true pod
// can, and writes there as its own uid.
func TestNoIdmapVolumeStandsInForNFS(t *testing.T) {
	c := SharedNode(t)
	if f, _ := c.Node(); !f.FUSE {
		t.Fatal("no bindfs or /dev/fuse on this machine (`make node-tools` installs bindfs)")
	}
	ctx := t.Context()
	ns := c.Namespace(t)
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "sessions"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
		StorageClassName: ptr.To(StorageClassNoIdmap),
		Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
	}}
	if _, err := c.Client().CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var hostPath string
	for deadline := time.Now().Add(time.Minute); hostPath == ""; time.Sleep(200 * time.Millisecond) {
		p, err := c.Client().CoreV1().PersistentVolumeClaims(ns).Get(ctx, "sessions", metav1.GetOptions{})
		if err == nil && p.Spec.VolumeName != "" {
			pv, err := c.Client().CoreV1().PersistentVolumes().Get(ctx, p.Spec.VolumeName, metav1.GetOptions{})
			if err == nil {
				hostPath = pv.Spec.HostPath.Path
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("claim not bound in a minute")
		}
	}
	if err := idmapMount(hostPath); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("an idmapped mount of the stand-in volume: %v, want EINVAL (as NFS)", err)
	}
	if err := idmapMount(t.TempDir()); err != nil {
		t.Fatalf("an idmapped mount of a plain directory: %v (the check itself is broken)", err)
	}
	withVolume := func(name string, hostUsers bool) *corev1.Pod {
		p := busyboxPod(name, "id -u > /data/"+name+"; exec sleep 3600")
		p.Spec.HostUsers = ptr.To(hostUsers)
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](4242)}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "sessions", MountPath: "/data"}}
		p.Spec.Volumes = []corev1.Volume{{Name: "sessions", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "sessions"}}}}
		p.Spec.InitContainers = []corev1.Container{{Name: "own", Image: BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"chmod", "1777", "/data"}, VolumeMounts: p.Spec.Containers[0].VolumeMounts}}
		return p
	}
	if _, err := c.Client().CoreV1().Pods(ns).Create(ctx, withVolume("plain", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, c, ns, "plain", "running", running)
	var st syscall.Stat_t
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := syscall.Stat(filepath.Join(hostPath, "plain"), &st); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the pod's file is not on the volume: %v", err)
		}
	}
	if st.Uid != 4242 {
		t.Errorf("a hostUsers: true pod's file belongs to uid %d on the volume, want 4242", st.Uid)
	}
	if _, err := c.Client().CoreV1().Pods(ns).Create(ctx, withVolume("userns", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPod(t, c, ns, "userns", "refused by the runtime", func(p *corev1.Pod) bool {
		for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			if w := s.State.Waiting; w != nil && strings.Contains(w.Message, "idmap") {
				return true
			}
		}
		return false
	})
	if running(p) {
		t.Fatal("a hostUsers: false pod runs with a volume that refuses idmapped mounts")
	}
}

// idmapMount tries to make an idmapped mount of path (a detached clone,
// never attached) with a user namespace's mapping.
func idmapMount(path string) error {
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 1 << 20, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 1 << 20, Size: 65536}}}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	if err != nil {
		return err
	}
	defer ns.Close()
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(fd)
	return unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns.Fd())})
}

// The teardown check finds what a node leaves: a process, mount, link,
// changed sysctl or host path that was not there before.
func TestHostStateDiff(t *testing.T) {
	before := hostState{links: []string{"lo", "eth0"}, sysctls: map[string]string{"kernel/panic": "0"},
		paths: map[string][]string{"/var/lib/cni": {"a"}}}
	after := hostState{links: []string{"lo", "eth0", "talkide-host"}, sysctls: map[string]string{"kernel/panic": "10"},
		procs: []string{"pid 7 /x/containerd"}, mounts: []string{"/tmp/x/talkide-node/kubelet (tmpfs)"},
		paths: map[string][]string{"/var/lib/cni": {"a", "results"}, "/run/containerd": {}}}
	got := strings.Join(before.diff(after), "\n")
	for _, want := range []string{"link talkide-host", "sysctl kernel/panic is 10, was 0", "process pid 7", "mount /tmp/x/talkide-node/kubelet",
		"path /var/lib/cni/results", "path /run/containerd"} {
		if !strings.Contains(got, want) {
			t.Errorf("diff lacks %q:\n%s", want, got)
		}
	}
	if d := before.diff(before); len(d) != 0 {
		t.Errorf("a state differs from itself: %v", d)
	}
}
