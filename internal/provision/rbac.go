package provision

import (
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WorkerRules are the rights of a worker's ServiceAccount in its own
// namespace (Role talkide-worker), and nothing more: build Jobs it
// dispatches, their pods and logs, and the Leases of conversation
// ownership. Nothing cluster-wide.
func WorkerRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "list", "watch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "pods/log"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update", "delete"}},
	}
}

// ClusterRoleName is the name of the control plane's ClusterRole.
const ClusterRoleName = "talkide-controlplane"

// ClusterRole is what the control plane's ServiceAccount needs for the
// K8sWorkerProvisioner, bound with a ClusterRoleBinding: the one written
// definition of it (the Helm chart renders it from
// `talkide-controlplane clusterrole`).
//
// Why each rule:
//   - namespaces: create, read, update the labels of, and delete the
//     tenant-env namespaces (deleting one removes all of a worker).
//   - secrets, serviceaccounts, services, persistentvolumeclaims,
//     deployments, roles, rolebindings, networkpolicies: the worker's
//     objects in its namespace (server-side apply is a patch).
//   - pods, events: read only, for the reason a worker is not ready.
//   - endpoints "kubernetes" (get): where the API server is, for the
//     worker's NetworkPolicy.
//   - validatingadmissionpolicies and their bindings: create, and patch
//     only talkide-worker-jobs, the policy that keeps workers' Jobs
//     unprivileged (policy.go).
//   - WorkerRules again: Kubernetes lets a subject grant in a Role only
//     rights it holds itself (no "escalate"/"bind" verbs are asked for).
func ClusterRole() *rbacv1.ClusterRole {
	manage := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: manage},
		{APIGroups: []string{""}, Resources: []string{"secrets", "serviceaccounts", "services", "persistentvolumeclaims"}, Verbs: manage},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: manage},
		{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"roles", "rolebindings"}, Verbs: manage},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: manage},
		{APIGroups: []string{""}, Resources: []string{"pods", "events"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"endpoints"}, ResourceNames: []string{"kubernetes"}, Verbs: []string{"get"}},
		{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"}, Verbs: []string{"create"}},
		{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"},
			ResourceNames: []string{JobPolicyName}, Verbs: []string{"get", "patch", "update"}},
	}
	rules = append(rules, WorkerRules()...)
	return &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: ClusterRoleName, Labels: map[string]string{LabelPartOf: PartOf}},
		Rules:      rules,
	}
}
