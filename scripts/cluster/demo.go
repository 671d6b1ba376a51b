package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/talkide/talkide/internal/clusterdemo"
	"github.com/talkide/talkide/internal/kubetest"
)

// upstreamFile, in the cluster's state dir, holds the development
// upstream's address and key (0600), which only the control plane's Secret
// gets.
const upstreamFile = "devupstream.json"

// demoURLFile, in the cluster's state dir, holds the demo's URL (with its
// user's token; 0600) once it is installed.
const demoURLFile = "demo-url"

// upstreamInfo is what upstreamFile holds.
type upstreamInfo struct {
	URL string `json:"url"`
	Key string `json:"key"`
}

// serveUpstream runs the development upstream (clusterdemo.ServeUpstream)
// until ctx ends and writes where it is to upstreamFile.
func serveUpstream(ctx context.Context, state string, c *kubetest.Cluster) error {
	url, key, err := clusterdemo.ServeUpstream(ctx, c.AllowPodsToHost)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(upstreamInfo{URL: url, Key: key})
	return os.WriteFile(filepath.Join(state, upstreamFile), b, 0o600)
}

// demo is `make cluster-demo`: the cluster with its real node up (in the
// background, as `up`, with the development upstream), then
// clusterdemo.Install. It ends printing KUBECONFIG=<path> and
// URL=<address>#token=<token>, each on a line of its own.
func demo(ctx context.Context, root, state, helm string, nodes int) error {
	if !realNode {
		return errors.New("the demo needs the real node (run it as root)")
	}
	if len(clusterdemo.Images(root)) != len(clusterdemo.ImageNames) {
		return errors.New("the demo needs the three images of `make images`")
	}
	if err := up(ctx, state, nodes, true, true); err != nil {
		return err
	}
	kc, err := os.ReadFile(filepath.Join(state, "ready"))
	if err != nil {
		return err
	}
	kubeconfig := strings.TrimSpace(string(kc))
	// A demo that ran on this cluster already: the images now built go to
	// the node, the install is redone (an upgrade), its user kept.
	var userToken string
	if b, err := os.ReadFile(filepath.Join(state, demoURLFile)); err == nil {
		fmt.Fprintln(os.Stderr, "cluster-demo: the demo runs on this cluster already: loading the images now built and upgrading it")
		_, userToken, _ = strings.Cut(strings.TrimSpace(string(b)), "#token=")
		for _, img := range clusterdemo.Images(root) {
			if err := kubetest.ImportImage(ctx, state, kubetest.NodeBinDir(root, kubetest.Pinned()), img); err != nil {
				return err
			}
		}
	}
	var upInfo upstreamInfo
	if b, err := os.ReadFile(filepath.Join(state, upstreamFile)); err != nil || json.Unmarshal(b, &upInfo) != nil {
		return fmt.Errorf("the running cluster was started without the demo's development upstream (by make cluster?): stop it with `make cluster-down`, then run `make cluster-demo` again (%v)", err)
	}
	kubectl := filepath.Join(kubetest.BinDir(root, kubetest.Pinned()), "kubectl")
	res, err := clusterdemo.Install(ctx, clusterdemo.Options{Root: root, Kubeconfig: kubeconfig,
		Kubectl: kubectl, Helm: helm, UpstreamURL: upInfo.URL, UpstreamKey: upInfo.Key, Log: os.Stderr, UserToken: userToken})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "cluster-demo: ready. The control plane runs in a pod of the real node; a message you send runs in\n"+
		"the worker's pod there (namespace %s-%s). kubectl: %s. Stop everything with `make cluster-down`.\n", clusterdemo.Tenant, clusterdemo.Env, kubectl)
	if err := os.WriteFile(filepath.Join(state, demoURLFile), []byte(res.URL+"\n"), 0o600); err != nil {
		return err
	}
	fmt.Printf("KUBECONFIG=%s\n", kubeconfig)
	fmt.Printf("URL=%s\n", res.URL)
	return nil
}
