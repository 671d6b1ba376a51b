// Command cluster builds and runs the test cluster of internal/kubetest by
// hand (docs/testing.md, "Test cluster"):
//
//	cluster bins      build the control plane's pinned binaries into .cache/k8s/<versions>/ (once)
//	cluster node-bins build the real node's (kubelet, containerd, runc, CNI, CoreDNS) into .cache/k8s/node-<versions>/
//	cluster up      start the cluster in the background; prints KUBECONFIG=<path>
//	cluster down    stop the cluster `up` started
//	cluster serve   start the cluster in the foreground until Ctrl-C
//	cluster demo    the cluster with its real node, the chart installed, a tenant-env provisioned (make cluster-demo)
//
// `make cluster-bins`, `make cluster` and `make cluster-down` call it. The
// state of the background cluster (kubeconfig, certificates, logs) lives in
// .cache/k8s/cluster/ while it runs; `down` removes it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/talkide/talkide/internal/clusterdemo"
	"github.com/talkide/talkide/internal/kubetest"
)

func main() {
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: cluster bins|node-bins|up|down|serve|demo [flags]")
		flag.PrintDefaults()
	}
	nodes := flag.Int("nodes", 1, "number of kwok fake nodes")
	flag.BoolVar(&realNode, "real-node", os.Geteuid() == 0, "add a real node (kubelet, containerd, runc) beside the kwok nodes; needs root")
	flag.BoolVar(&withUpstream, "upstream", false, "also serve the development upstream on the node's host address (the demo's)")
	helm := flag.String("helm", "", "the helm binary (demo)")
	if len(os.Args) < 2 {
		flag.Usage()
		os.Exit(2)
	}
	cmd := os.Args[1]
	_ = flag.CommandLine.Parse(os.Args[2:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cmd, *nodes, *helm); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

// realNode and withUpstream are the -real-node and -upstream flags.
var realNode, withUpstream bool

func run(ctx context.Context, cmd string, nodes int, helm string) error {
	root, err := kubetest.RepoRoot()
	if err != nil {
		return err
	}
	v := kubetest.Pinned()
	bins := kubetest.BinDir(root, v)
	state := filepath.Join(root, ".cache", "k8s", "cluster")
	switch cmd {
	case "bins":
		if err := kubetest.EnsureBuilt(ctx, bins, v, os.Stderr); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "cluster binaries %s in %s\n", v.Key(), bins)
		return nil
	case "node-bins":
		nodeBins := kubetest.NodeBinDir(root, v)
		if err := kubetest.EnsureNodeBuilt(ctx, nodeBins, v, os.Stderr); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "real node binaries %s in %s\n", v.NodeKey(), nodeBins)
		return nil
	case "up":
		if err := kubetest.EnsureBuilt(ctx, bins, v, os.Stderr); err != nil {
			return err
		}
		if realNode {
			if err := kubetest.EnsureNodeBuilt(ctx, kubetest.NodeBinDir(root, v), v, os.Stderr); err != nil {
				return err
			}
		}
		return up(ctx, state, nodes, false, false)
	case "demo":
		if err := kubetest.EnsureBuilt(ctx, bins, v, os.Stderr); err != nil {
			return err
		}
		if err := kubetest.EnsureNodeBuilt(ctx, kubetest.NodeBinDir(root, v), v, os.Stderr); err != nil {
			return err
		}
		if helm == "" {
			return errors.New("demo: -helm is required (make cluster-demo passes the pinned one)")
		}
		return demo(ctx, root, state, helm, nodes)
	case "down":
		return down(state)
	case "serve":
		if err := kubetest.EnsureBuilt(ctx, bins, v, os.Stderr); err != nil {
			return err
		}
		if realNode {
			if err := kubetest.EnsureNodeBuilt(ctx, kubetest.NodeBinDir(root, v), v, os.Stderr); err != nil {
				return err
			}
		}
		return serve(ctx, bins, state, nodes, "")
	case "serve-background": // started by up
		return serve(ctx, bins, state, nodes, filepath.Join(state, "ready"))
	}
	return fmt.Errorf("unknown command %q (want bins, node-bins, up, down, serve or demo)", cmd)
}

// serve runs the cluster until ctx ends; ready, when set, gets the
// kubeconfig path once the cluster is ready.
func serve(ctx context.Context, bins, state string, nodes int, ready string) error {
	if err := os.RemoveAll(state); err != nil {
		return err
	}
	opts := kubetest.Options{BinDir: bins, Dir: state, Nodes: nodes, Log: os.Stderr}
	if realNode {
		root, err := kubetest.RepoRoot()
		if err != nil {
			return err
		}
		opts.RealNode, opts.NodeBinDir = true, kubetest.NodeBinDir(root, kubetest.Pinned())
		opts.NodeImages = clusterdemo.Images(root)
	}
	c, err := kubetest.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer c.Stop()
	if withUpstream {
		if err := serveUpstream(ctx, state, c); err != nil {
			return err
		}
	}
	fmt.Printf("KUBECONFIG=%s\n", c.Kubeconfig())
	fmt.Fprintf(os.Stderr, "kubectl: %s\nlogs: %s/*.log\n", filepath.Join(bins, "kubectl"), state)
	if realNode {
		fmt.Fprintf(os.Stderr, "real node %s at %s (its logs: %s/*.log); images loaded: %d\n", kubetest.NodeName, kubetest.NodeAddr, c.NodeDir(), len(opts.NodeImages))
		for _, img := range opts.NodeImages {
			fmt.Fprintf(os.Stderr, "  %s (from %s)\n", img.Repository, img.Layout)
		}
		if f, _ := c.Node(); !f.NFTQueue {
			fmt.Fprintln(os.Stderr, strings.Replace(kubetest.NoNetworkPolicyEnforcement, "is NOT tested", "is NOT enforced", 1))
		}
	}
	if ready != "" {
		if err := os.WriteFile(ready, []byte(c.Kubeconfig()), 0o600); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(os.Stderr, "export KUBECONFIG=%s\nrunning until Ctrl-C\n", c.Kubeconfig())
	}
	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "stopping the cluster")
	return nil
}

// up starts `serve-background` detached (its own session, output to
// serve.log) and waits until it reports the cluster ready.
// up prints KUBECONFIG=<path> once the cluster is ready, unless quiet (the
// demo prints it at its end).
func up(ctx context.Context, state string, nodes int, upstream, quiet bool) error {
	pidFile := filepath.Join(filepath.Dir(state), "cluster.pid")
	if pid, ok := running(pidFile); ok {
		kc, _ := os.ReadFile(filepath.Join(state, "ready"))
		if !quiet {
			fmt.Printf("KUBECONFIG=%s\n", kc)
		}
		fmt.Fprintf(os.Stderr, "the cluster is already running (pid %d); stop it with `make cluster-down`\n", pid)
		return nil
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// A ready file left by an earlier run must not be taken for this one.
	if err := os.RemoveAll(state); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(state), 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(filepath.Dir(state), "cluster.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(self, "serve-background", "-nodes", strconv.Itoa(nodes), "-real-node="+strconv.FormatBool(realNode), "-upstream="+strconv.FormatBool(upstream))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ready := filepath.Join(state, "ready")
	deadline := time.After(5 * time.Minute)
	for {
		if kc, err := os.ReadFile(ready); err == nil && len(kc) > 0 {
			if !quiet {
				fmt.Printf("KUBECONFIG=%s\n", kc)
			}
			fmt.Fprintf(os.Stderr, "the cluster runs in the background (pid %d, log %s)\n"+
				"use it with: export KUBECONFIG=%s\nstop it with: make cluster-down\n", cmd.Process.Pid, logPath, kc)
			return nil
		}
		select {
		case err := <-exited:
			os.Remove(pidFile)
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("the cluster did not start (%v):\n%s", err, b)
		case <-deadline:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			return fmt.Errorf("the cluster was not ready within 5 minutes; see %s", logPath)
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGTERM)
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// down stops the background cluster: SIGTERM to its supervisor, which
// stops every component; SIGKILL after 30 s (the components die with it).
func down(state string) error {
	pidFile := filepath.Join(filepath.Dir(state), "cluster.pid")
	pid, ok := running(pidFile)
	if !ok {
		os.Remove(pidFile)
		fmt.Fprintln(os.Stderr, "no cluster is running")
		return removeState(state)
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for range 300 {
		if !alive(pid) {
			os.Remove(pidFile)
			fmt.Fprintln(os.Stderr, "cluster stopped")
			return removeState(state)
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	os.Remove(pidFile)
	return errors.New("the cluster did not stop within 30 s; killed it")
}

// removeState removes the stopped cluster's state (its Secrets in etcd,
// the node's images and volumes, the agents' transcripts on them): the
// logs go too. Never while anything is still mounted below it.
func removeState(state string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4]+"/", state+"/") {
			return fmt.Errorf("%s is still mounted below the cluster's state; left it in place", f[4])
		}
	}
	if err := os.RemoveAll(state); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "removed the cluster's state (%s)\n", state)
	return nil
}

// running reads the supervisor's pid and reports whether it is alive.
func running(pidFile string) (int, bool) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, alive(pid)
}

func alive(pid int) bool {
	// A zombie (exited, not yet reaped) counts as gone.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}
