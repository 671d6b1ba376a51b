package main

//go:generate sh -c "go run . clusterrole > ../../deploy/helm/talkide/files/cluster-policies.yaml"

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/kubename"
)

// provisionFromEnv reads the provisioner's settings (provision.Config).
func provisionFromEnv(cfg *controlplane.Config) error {
	cfg.Provisioner = os.Getenv("TALKIDE_PROVISIONER")
	cfg.Kubeconfig = os.Getenv("KUBECONFIG")
	p := &cfg.Provision
	p.Installation = os.Getenv("TALKIDE_INSTALLATION")
	p.Image = os.Getenv("TALKIDE_WORKER_IMAGE")
	p.ImagePullPolicy = corev1.PullPolicy(os.Getenv("TALKIDE_WORKER_IMAGE_PULL_POLICY"))
	switch p.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return fmt.Errorf("TALKIDE_WORKER_IMAGE_PULL_POLICY %q: want Always, IfNotPresent or Never", p.ImagePullPolicy)
	}
	p.BuildImage = os.Getenv("TALKIDE_WORKER_BUILD_IMAGE")
	p.StorageClass = os.Getenv("TALKIDE_WORKER_STORAGE_CLASS")
	p.GatewayURL = os.Getenv("TALKIDE_WORKER_GATEWAY_URL")
	p.ControlPlaneNamespace = os.Getenv("TALKIDE_NAMESPACE")
	if p.ControlPlaneNamespace == "" {
		p.ControlPlaneNamespace = os.Getenv("POD_NAMESPACE")
	}
	p.HostUIDDir = os.Getenv("TALKIDE_WORKER_HOST_UID_DIR")
	switch v := os.Getenv("TALKIDE_WORKER_USER_NAMESPACE"); v {
	case "", "false":
	case "true":
		p.UserNamespace = true
	default:
		return fmt.Errorf("TALKIDE_WORKER_USER_NAMESPACE %q: want true or false", v)
	}
	p.RuntimeClass = os.Getenv("TALKIDE_WORKER_RUNTIME_CLASS")
	for g := range strings.SplitSeq(os.Getenv("TALKIDE_WORKER_CONTAINMENT_REQUIRE"), ",") {
		if g = strings.TrimSpace(g); g != "" {
			p.ContainmentRequire = append(p.ContainmentRequire, g)
		}
	}
	var err error
	if p.NodeSelector, err = kubename.ParseSelector(os.Getenv("TALKIDE_WORKER_NODE_SELECTOR")); err != nil {
		return fmt.Errorf("TALKIDE_WORKER_NODE_SELECTOR: %w", err)
	}
	if p.Tolerations, err = kubename.ParseTolerations(os.Getenv("TALKIDE_WORKER_TOLERATIONS")); err != nil {
		return fmt.Errorf("TALKIDE_WORKER_TOLERATIONS: %w", err)
	}
	if v := os.Getenv("TALKIDE_WORKER_REPLICAS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10 {
			return fmt.Errorf("TALKIDE_WORKER_REPLICAS %q: want 1 to 10", v)
		}
		p.Replicas = int32(n)
	}
	if v := os.Getenv("TALKIDE_WORKER_MAX_JOBS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			return fmt.Errorf("TALKIDE_WORKER_MAX_JOBS %q: want 1 to 10000", v)
		}
		p.MaxJobs = n
	}
	if v := os.Getenv("TALKIDE_WORKER_STORAGE_SIZE"); v != "" {
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() <= 0 {
			return fmt.Errorf("TALKIDE_WORKER_STORAGE_SIZE %q: want a size like 10Gi", v)
		}
		p.StorageSize = q
	}
	for name, set := range map[string]func(resource.Quantity){
		"TALKIDE_WORKER_CPU_REQUEST":    func(q resource.Quantity) { setResource(&p.Resources.Requests, corev1.ResourceCPU, q) },
		"TALKIDE_WORKER_MEMORY_REQUEST": func(q resource.Quantity) { setResource(&p.Resources.Requests, corev1.ResourceMemory, q) },
		"TALKIDE_WORKER_CPU_LIMIT":      func(q resource.Quantity) { setResource(&p.Resources.Limits, corev1.ResourceCPU, q) },
		"TALKIDE_WORKER_MEMORY_LIMIT":   func(q resource.Quantity) { setResource(&p.Resources.Limits, corev1.ResourceMemory, q) },
	} {
		if v := os.Getenv(name); v != "" {
			q, err := resource.ParseQuantity(v)
			if err != nil || q.Sign() <= 0 {
				return fmt.Errorf("%s %q: want a quantity like 500m or 2Gi", name, v)
			}
			set(q)
		}
	}
	if v := os.Getenv("TALKIDE_CONTROLPLANE_POD_LABELS"); v != "" {
		p.ControlPlaneLabels = map[string]string{}
		for kv := range strings.SplitSeq(v, ",") {
			k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || k == "" {
				return fmt.Errorf("TALKIDE_CONTROLPLANE_POD_LABELS %q: want key=value,...", v)
			}
			p.ControlPlaneLabels[k] = val
		}
	}
	for name, dst := range map[string]*[]string{"TALKIDE_WORKER_APISERVER_CIDRS": &p.APIServerCIDRs, "TALKIDE_WORKER_EGRESS_CIDRS": &p.EgressCIDRs} {
		for c := range strings.SplitSeq(os.Getenv(name), ",") {
			if c = strings.TrimSpace(c); c != "" {
				*dst = append(*dst, c)
			}
		}
	}
	env, err := provision.ParseEnv(os.Getenv("TALKIDE_WORKER_ENV"))
	if err != nil {
		return fmt.Errorf("TALKIDE_WORKER_ENV: %w", err)
	}
	p.Env = env
	if v := os.Getenv("TALKIDE_CONFIG_REVISION"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("TALKIDE_CONFIG_REVISION %q: want a positive integer (the chart sets the Helm release revision)", v)
		}
		p.ConfigRevision = n
	}
	for name, dst := range map[string]*time.Duration{
		"TALKIDE_IDENTITY_TTL": &p.IdentityTTL, "TALKIDE_IDENTITY_ROTATE_BEFORE": &p.RotateBefore,
		"TALKIDE_IDENTITY_ROTATION_GRACE": &p.Grace, "TALKIDE_PROVISION_WAIT": &p.TerminatingWait, "TALKIDE_PROVISION_RESYNC": &p.Resync,
	} {
		if v := os.Getenv(name); v != "" {
			d, err := parseDays(v)
			if err != nil || d <= 0 {
				return fmt.Errorf("%s %q: want a positive duration like 90d, 12h or 30s", name, v)
			}
			*dst = d
		}
	}
	return nil
}

// parseDays is time.ParseDuration that also takes whole days ("90d").
func parseDays(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil {
			return 0, err
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}

func setResource(l *corev1.ResourceList, name corev1.ResourceName, q resource.Quantity) {
	if *l == nil {
		*l = corev1.ResourceList{}
	}
	(*l)[name] = q
}

// provisionCommand runs provision, deprovision, status or rotate-identity
// for one tenant-env and prints the status as JSON. provision waits until
// the objects exist (and with -wait until the worker is ready).
func provisionCommand(ctx context.Context, name string, args []string, out io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	tenant := fs.String("tenant", "", "tenant")
	env := fs.String("env", "", "env")
	var wait *time.Duration
	if name == "provision" {
		wait = fs.Duration("wait", 0, "also wait this long for the worker to be ready (0: return once its objects exist)")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !provision.ValidName(*tenant) || !provision.ValidName(*env) {
		return fmt.Errorf("%s: -tenant and -env: want DNS labels of at most 30 characters ([a-z0-9-])", name)
	}
	cfg, err := readConfig(log)
	if err != nil {
		return &contract.ConfigError{Err: err}
	}
	cfg.ForProvisionerCommand()
	if err := cfg.Validate(); err != nil {
		return &contract.ConfigError{Err: err}
	}
	db, err := controlplane.OpenDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	p, err := controlplane.NewProvisioner(cfg, db, mint.New(db, cfg.MasterKeys[0], log, cfg.MasterKeys[1:]...))
	if err != nil {
		return err
	}
	var st provision.Status
	switch name {
	case "provision":
		st, err = p.Provision(ctx, *tenant, *env)
		if err == nil && *wait > 0 {
			deadline := time.Now().Add(*wait)
			for st.Phase != provision.PhaseReady && st.Phase != provision.PhaseFailed && time.Now().Before(deadline) {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Second):
				}
				st, err = p.Status(ctx, *tenant, *env)
			}
			if err == nil && st.Phase != provision.PhaseReady {
				err = fmt.Errorf("provision: not ready after %s: %s: %s", *wait, st.Reason, st.Message)
			}
		}
	case "deprovision":
		st, err = p.Deprovision(ctx, *tenant, *env)
	case "rotate-identity":
		st, err = p.RotateIdentity(ctx, *tenant, *env)
	default:
		st, err = p.Status(ctx, *tenant, *env)
	}
	if st.Tenant != "" {
		b, _ := json.MarshalIndent(st, "", "  ")
		fmt.Fprintln(out, string(b))
	}
	return err
}

// printClusterRole prints, as YAML documents, the control plane's
// ClusterRole, the admission policy (with its binding) that confines it to
// the namespaces it makes, and the one that keeps workers' Jobs
// unprivileged: what an administrator installs with the control plane.
// The chart carries the same objects (TestChartCarriesTheClusterPolicies;
// go generate writes them there).
func printClusterRole(out io.Writer) error {
	pol, bind := provision.ScopePolicy()
	jobs, jobsBind := provision.JobPolicy()
	for i, obj := range []any{provision.ClusterRole(), pol, bind, jobs, jobsBind} {
		b, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		if i > 0 {
			fmt.Fprintln(out, "---")
		}
		if _, err := out.Write(b); err != nil {
			return err
		}
	}
	return nil
}
