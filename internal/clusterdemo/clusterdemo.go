// Package clusterdemo installs the platform on a test cluster with a real
// node as an operator would (docs/deploying.md, "Trying it on this
// machine"): the control plane's Secret, the chart with the images of
// `make images`, one tenant-env provisioned through the operator API and a
// user to sign in with. `make cluster-demo` (scripts/cluster) and this
// package's test run it; the development upstream stands in for Anthropic
// (ServeUpstream).
//
// It is for the test cluster and the demo only: it reaches the control
// plane at its Service's address, which only a host that routes the
// cluster's Service network (kubetest's real node) can.
package clusterdemo

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/token"
)

// ImageRepository is the repository the real node knows an image of `make
// images` by: ImageRepository + "/" + its name, by digest.
const ImageRepository = "talkide.local"

// ImageNames are the images of `make images`.
var ImageNames = []string{"talkide-controlplane", "talkide-worker", "talkide-builder-gradle"}

// Images are the images `make images` built (their OCI layouts under
// .cache/images/oci of the repository root), named for the real node;
// none when they are not built.
func Images(root string) []kubetest.NodeImage {
	var out []kubetest.NodeImage
	for _, name := range ImageNames {
		layout := filepath.Join(root, ".cache", "images", "oci", name)
		if _, err := os.Stat(filepath.Join(layout, "index.json")); err == nil {
			out = append(out, kubetest.NodeImage{Layout: layout, Repository: ImageRepository + "/" + name})
		}
	}
	return out
}

// ServeUpstream serves the development upstream, standing in for
// Anthropic outside the cluster, on the real node's host address, with a
// fresh key, until ctx ends; allow (the cluster's AllowPodsToHost) opens
// its port to the node's pods. It returns its URL and key.
func ServeUpstream(ctx context.Context, allow func(port int) error) (url, key string, err error) {
	key = "sk-ant-demo-" + randomToken(24)
	ln, err := net.Listen("tcp", kubetest.HostAddr+":0")
	if err != nil {
		return "", "", err
	}
	if err := allow(ln.Addr().(*net.TCPAddr).Port); err != nil {
		ln.Close()
		return "", "", err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv := &http.Server{Handler: devupstream.New(devupstream.Config{APIKey: key, Logger: log}), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	go func() { <-ctx.Done(); srv.Close() }()
	return "http://" + ln.Addr().String(), key, nil
}

// Options are what Install needs.
type Options struct {
	// Root is the repository (the chart, the images' layouts).
	Root string
	// Kubeconfig, Kubectl and Helm: an administrator's kubeconfig and the
	// binaries to run.
	Kubeconfig, Kubectl, Helm string
	// UpstreamURL and UpstreamKey are the Anthropic-compatible API the
	// control plane is given (ServeUpstream's).
	UpstreamURL, UpstreamKey string
	// StorageClass of the workers' session volumes. Default
	// kubetest.StorageClassNoIdmap (the NFS stand-in).
	StorageClass string
	// Log gets a line per step. Nil: none.
	Log io.Writer
	// UserToken is an earlier Install's (a second demo on the same
	// cluster): kept when the control plane still knows it.
	UserToken string
}

// The demo's namespace, tenant-env and user.
const (
	Namespace = "talkide-system"
	Tenant    = "demo"
	Env       = "dev"
	User      = "dev"
)

// Installed is what Install made.
type Installed struct {
	// BaseURL is the control plane's Service, as this host reaches it.
	BaseURL string
	// UserToken signs User in; URL opens the UI with it.
	UserToken, URL string
	// AdminToken is the operator API's token.
	AdminToken string
}

// Install installs (or upgrades) the chart with the images of `make
// images` (imported into the real node), provisions Tenant/Env through the
// operator API, waits until its worker is Ready on the real node, and adds
// User (keeping Options.UserToken where it still signs in). Running it
// again is safe: it moves the control plane and the worker to the images
// now built.
func Install(ctx context.Context, o Options) (Installed, error) {
	var res Installed
	if o.StorageClass == "" {
		o.StorageClass = kubetest.StorageClassNoIdmap
	}
	logw := o.Log
	if logw == nil {
		logw = io.Discard
	}
	step := func(what string) { fmt.Fprintf(logw, "cluster-demo: %s\n", what) }
	refs := map[string]string{}
	for _, img := range Images(o.Root) {
		d, err := kubetest.LayoutDigest(img.Layout)
		if err != nil {
			return res, err
		}
		refs[filepath.Base(img.Layout)] = d
	}
	if len(refs) != len(ImageNames) {
		return res, errors.New("the demo needs the three images of `make images`")
	}
	run := func(stdin io.Reader, name string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, name, args...)
		// Helm keeps its state beside the cluster's, not in $HOME.
		home := filepath.Join(filepath.Dir(o.Kubeconfig), "helm")
		cmd.Env = append(os.Environ(), "KUBECONFIG="+o.Kubeconfig, "HELM_CACHE_HOME="+home+"/cache",
			"HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
		cmd.Stdin = stdin
		out, err := cmd.CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}

	// A Secret of an earlier install stays: a new master key would void
	// every token the control plane gave.
	if out, err := run(nil, o.Kubectl, "-n", Namespace, "get", "secret", "talkide-controlplane", "-o", "jsonpath={.data.admin-token}"); err == nil {
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(out))
		if err != nil || len(b) == 0 {
			return res, fmt.Errorf("the Secret talkide-controlplane of %s has no admin-token", Namespace)
		}
		res.AdminToken = string(b)
		step("the control plane's Secret exists: kept")
		return res, install(ctx, o, &res, refs, run, step)
	}
	step("the control plane's namespace and Secret (a fresh master key and admin token; the development upstream's key)")
	master, err := token.NewMasterKey("k1")
	if err != nil {
		return res, err
	}
	res.AdminToken = randomToken(24)
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %s}
---
apiVersion: v1
kind: Secret
metadata: {name: talkide-controlplane, namespace: %s}
type: Opaque
stringData:
  master-keys: %q
  anthropic-api-key: %q
  admin-token: %q
`, Namespace, Namespace, master.String(), o.UpstreamKey, res.AdminToken)
	if _, err := run(strings.NewReader(manifest), o.Kubectl, "apply", "-f", "-"); err != nil {
		return res, err
	}
	return res, install(ctx, o, &res, refs, run, step)
}

// install is Install after the Secret: the chart, the tenant-env, the user.
func install(ctx context.Context, o Options, res *Installed, refs map[string]string,
	run func(io.Reader, string, ...string) (string, error), step func(string)) error {
	step("the chart (helm upgrade --install: one replica, SQLite on a volume of its own)")
	if _, err := run(nil, o.Helm, "upgrade", "--install", "talkide", filepath.Join(o.Root, "deploy", "helm", "talkide"),
		"-n", Namespace, "--wait", "--timeout", "5m",
		"--set", "replicaCount=1", "--set", "database.embedded=true",
		"--set", "upstreamURL="+o.UpstreamURL,
		"--set", "image.repository="+ImageRepository+"/talkide-controlplane", "--set", "image.digest="+refs["talkide-controlplane"],
		"--set", "worker.image.repository="+ImageRepository+"/talkide-worker", "--set", "worker.image.digest="+refs["talkide-worker"],
		"--set", "builds.gradleImage.repository="+ImageRepository+"/talkide-builder-gradle", "--set", "builds.gradleImage.digest="+refs["talkide-builder-gradle"],
		"--set", "worker.storageClass="+o.StorageClass, "--set", "worker.storageSize=2Gi", "--set", "worker.hostUIDDir="+kubetest.NodeHostUIDDir,
		"--set", "worker.resources.cpuRequest=100m", "--set", "worker.resources.memoryRequest=512Mi",
		"--set", "resources.requests.cpu=50m"); err != nil {
		return err
	}
	ip, err := run(nil, o.Kubectl, "-n", Namespace, "get", "service", "talkide-controlplane", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		return err
	}
	res.BaseURL = "http://" + strings.TrimSpace(ip) + ":8080"
	step("provisioning tenant " + Tenant + ", env " + Env + " on the real node (" + res.BaseURL + "/api/admin/workers/" + Tenant + "/" + Env + ")")
	if err := provision(ctx, res.BaseURL, res.AdminToken); err != nil {
		return err
	}
	if o.UserToken != "" && knownUser(ctx, res.BaseURL, o.UserToken) {
		res.UserToken = o.UserToken
	} else {
		res.UserToken = "tk_" + randomToken(24)
		// User, or, when a lost token's user exists, one of another name.
		for _, id := range []string{User, User + "-" + strings.ToLower(randomToken(4))} {
			out, err := run(nil, o.Kubectl, "-n", Namespace, "exec", "deploy/talkide-controlplane", "--",
				"talkide-controlplane", "add-user", "-id", id, "-grant", Tenant+"/"+Env, "-token", res.UserToken)
			if err == nil {
				break
			}
			if !strings.Contains(out, "exists") || id != User {
				return err
			}
		}
	}
	res.URL = res.BaseURL + "/#token=" + res.UserToken
	return nil
}

// knownUser reports whether the control plane at base signs tok in.
func knownUser(ctx context.Context, base, tok string) bool {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/me", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// provision provisions the demo's tenant-env through the operator API and
// waits until its worker is Ready (five minutes at most).
func provision(ctx context.Context, base, admin string) error {
	path := base + "/api/admin/workers/" + Tenant + "/" + Env
	call := func(method string) (int, map[string]any, error) {
		req, _ := http.NewRequestWithContext(ctx, method, path, nil)
		req.Header.Set("Authorization", "Bearer "+admin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		var st map[string]any
		json.NewDecoder(resp.Body).Decode(&st)
		return resp.StatusCode, st, nil
	}
	// A control plane just upgraded leaves the workers to the one before
	// for its first 30 s (503 OutdatedConfig, Retry-After): asked again.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		code, st, err := call("PUT")
		if err == nil && code < 300 {
			break
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return fmt.Errorf("provision: %d %v %v", code, st, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	for {
		_, st, err := call("GET")
		if err == nil && st["phase"] == "Ready" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the worker was not Ready in 5 minutes: %v %v", st, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func randomToken(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}
