package worker

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/talkide/talkide/internal/contract"
)

// kubeRight is one access of the worker's ServiceAccount, asked of the API
// server with a SelfSubjectAccessReview (which every authenticated subject
// may make). ns "" is cluster-wide; "*other*" stands for a namespace not the
// worker's.
type kubeRight struct {
	group, resource, sub, verb, ns string
}

func (r kubeRight) String() string {
	res := r.resource
	if r.sub != "" {
		res += "/" + r.sub
	}
	if r.group != "" {
		res += "." + r.group
	}
	where := "in namespace " + r.ns
	if r.ns == "" {
		where = "cluster-wide"
	}
	return r.verb + " " + res + " " + where
}

// otherNamespace names a namespace that is not the worker's in the checks
// of rights it must not have.
const otherNamespace = "kube-system"

// kubeRights lists what the worker's ServiceAccount must, should and must
// not be allowed in namespace ns (the provisioner's Role talkide-worker:
// internal/controlplane/provision WorkerRules).
func kubeRights(ns string) (must, should, mustNot []kubeRight) {
	for _, v := range []string{"get", "create", "update", "delete"} {
		must = append(must, kubeRight{"coordination.k8s.io", "leases", "", v, ns})
	}
	for _, v := range []string{"create", "get", "list", "watch", "delete"} {
		should = append(should, kubeRight{"batch", "jobs", "", v, ns})
	}
	for _, v := range []string{"get", "list", "watch"} {
		should = append(should, kubeRight{"", "pods", "", v, ns}, kubeRight{"", "pods", "log", v, ns})
	}
	should = append(should, kubeRight{"", "events", "", "list", ns})
	mustNot = []kubeRight{
		{"", "secrets", "", "get", ns},
		{"", "pods", "", "create", ns},
		{"", "pods", "exec", "create", ns},
		{"rbac.authorization.k8s.io", "roles", "", "create", ns},
		{"batch", "jobs", "", "create", otherNamespace},
		{"coordination.k8s.io", "leases", "", "update", otherNamespace},
		{"", "namespaces", "", "list", ""},
		{"", "secrets", "", "list", ""},
		{"", "nodes", "", "get", ""},
	}
	return must, should, mustNot
}

// checkKubeRights asks the API server what the worker's ServiceAccount may
// do. A missing right the worker cannot run without (its Leases) is an
// error naming it; a missing right of build Jobs is logged; a right beyond
// what a worker needs is logged as an error: an agent that escaped its jail
// would hold it. Errors reaching the API server are returned as they are.
func checkKubeRights(ctx context.Context, cs kubernetes.Interface, ns string, log *slog.Logger) error {
	must, should, mustNot := kubeRights(ns)
	allowed := func(r kubeRight) (bool, error) {
		sar := &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace: r.ns, Verb: r.verb, Group: r.group, Resource: r.resource, Subresource: r.sub}}}
		res, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return false, fmt.Errorf("ask the API server whether the worker may %s: %w", r, err)
		}
		return res.Status.Allowed, nil
	}
	collect := func(rights []kubeRight, want bool) ([]string, error) {
		var off []string
		for _, r := range rights {
			ok, err := allowed(r)
			if err != nil {
				return nil, err
			}
			if ok != want {
				off = append(off, r.String())
			}
		}
		return off, nil
	}
	missing, err := collect(must, true)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return &contract.ConfigError{Err: fmt.Errorf("the worker's ServiceAccount may not %s: it cannot hold conversation Leases (give it the Role the provisioner makes, talkide-worker)", strings.Join(missing, ", "))}
	}
	noBuilds, err := collect(should, true)
	if err != nil {
		return err
	}
	if len(noBuilds) > 0 {
		log.Warn("the worker's ServiceAccount lacks rights of build Jobs: builds will fail", "missing", noBuilds)
	}
	excess, err := collect(mustNot, false)
	if err != nil {
		return err
	}
	if len(excess) > 0 {
		log.Error("the worker's ServiceAccount has more rights than a worker needs: an agent that escaped its jail would hold them", "excess", excess)
	}
	log.Info("kubernetes rights checked", "namespace", ns, "leases", "ok", "build_jobs", len(noBuilds) == 0, "excess", len(excess))
	return nil
}
