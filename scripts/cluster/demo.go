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

// upstreamInfo is what upstreamFile holds.
type upstreamInfo struct {
	URL string `json:"url"`
	Key string `json:"key"`
}

// serveUpstream runs the development upstream (clusterdemo.ServeUpstream)
// until ctx ends and writes where it is to upstreamFile.
func serveUpstream(ctx context.Context, state string) error {
	url, key, err := clusterdemo.ServeUpstream(ctx)
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
	if err := up(ctx, state, nodes, true); err != nil {
		return err
	}
	kc, err := os.ReadFile(filepath.Join(state, "ready"))
	if err != nil {
		return err
	}
	var upInfo upstreamInfo
	if b, err := os.ReadFile(filepath.Join(state, upstreamFile)); err != nil || json.Unmarshal(b, &upInfo) != nil {
		return fmt.Errorf("the development upstream's address (%s): %v", upstreamFile, err)
	}
	kubectl := filepath.Join(kubetest.BinDir(root, kubetest.Pinned()), "kubectl")
	res, err := clusterdemo.Install(ctx, clusterdemo.Options{Root: root, Kubeconfig: strings.TrimSpace(string(kc)),
		Kubectl: kubectl, Helm: helm, UpstreamURL: upInfo.URL, UpstreamKey: upInfo.Key, Log: os.Stderr})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "cluster-demo: ready. The control plane runs in a pod of the real node; a message you send runs in\n"+
		"the worker's pod there (namespace %s-%s). kubectl: %s. Stop everything with `make cluster-down`.\n", clusterdemo.Tenant, clusterdemo.Env, kubectl)
	fmt.Printf("KUBECONFIG=%s\n", strings.TrimSpace(string(kc)))
	fmt.Printf("URL=%s\n", res.URL)
	return nil
}
