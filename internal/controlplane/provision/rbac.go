package provision

import (
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WorkerRules are the rights of a worker's ServiceAccount in its own
// namespace (Role talkide-worker), and nothing more: build Jobs it
// dispatches, their pods and logs, the events of its namespace (why a
// build Job could make no pod: a quota's refusal), and the Leases of
// conversation ownership. Nothing cluster-wide.
func WorkerRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "list", "watch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "pods/log"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update", "delete"}},
	}
}

// ClusterRoleName is the name of the control plane's ClusterRole, and of
// the ServiceAccount it is meant for (ControlPlaneServiceAccount).
const ClusterRoleName = "talkide-controlplane"

// ControlPlaneServiceAccount is the name the control plane's
// ServiceAccount must have: ScopePolicy and the Job policy match requests
// of ServiceAccounts of this name.
const ControlPlaneServiceAccount = "talkide-controlplane"

// ClusterRole is what the control plane's ServiceAccount needs for the
// K8sWorkerProvisioner, bound with a ClusterRoleBinding: the one written
// definition of it (`talkide-controlplane clusterrole` prints it with
// ScopePolicy and JobPolicy, for an administrator to install). Install
// ScopePolicy with it:
// RBAC cannot say "only in the provisioner's namespaces", the policy does.
//
// Why each rule:
//   - namespaces: make, relabel and delete the tenant-env namespaces
//     (ScopePolicy: only those labelled as the provisioner's may be
//     changed or deleted). Deleting one removes all of a worker.
//   - the worker's objects (Secret talkide-worker-token; ServiceAccount,
//     Role, RoleBinding, Deployment, Service, NetworkPolicy, ResourceQuota
//     talkide-worker;
//     PVC claude-sessions): create (RBAC cannot limit it by name;
//     ScopePolicy limits it to the provisioner's namespaces), and read or
//     change only those names: no other Secret anywhere can be read.
//   - pods, events: read, for the reason a worker is not ready.
//   - serviceaccounts, services, persistentvolumeclaims, resourcequotas,
//     deployments, roles, rolebindings, networkpolicies: list and watch,
//     for the controller's informers (Run), which select the
//     installation's labels; RBAC cannot limit a list by label, so these
//     kinds are readable everywhere (as pods already are; never Secrets).
//   - endpointslices "kubernetes" (get): where the API server is, for the
//     worker's NetworkPolicy.
//   - validatingadmissionpolicies and their bindings: read
//     talkide-worker-jobs and talkide-controlplane-scope (checked before
//     provisioning and at start); an administrator installs them.
//   - WorkerRules again: Kubernetes lets a subject grant in a Role only
//     rights it holds itself (no "escalate"/"bind" verbs are asked for);
//     their writes are confined by ScopePolicy, their reads are not.
func ClusterRole() *rbacv1.ClusterRole {
	named := func(group, resource, name string, verbs ...string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{group}, Resources: []string{resource}, ResourceNames: []string{name}, Verbs: verbs}
	}
	change := []string{"get", "update", "patch", "delete"}
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"secrets", "serviceaccounts", "services", "persistentvolumeclaims", "resourcequotas"}, Verbs: []string{"create"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"create"}},
		{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"roles", "rolebindings"}, Verbs: []string{"create"}},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"create"}},
		named("", "secrets", SecretName, change...),
		named("", "serviceaccounts", WorkerName, change...),
		named("", "services", WorkerName, change...),
		named("", "resourcequotas", QuotaName, change...),
		named("", "persistentvolumeclaims", PVCName, "get"),
		named("apps", "deployments", WorkerName, change...),
		named("rbac.authorization.k8s.io", "roles", WorkerName, change...),
		named("rbac.authorization.k8s.io", "rolebindings", WorkerName, change...),
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, ResourceNames: []string{WorkerName, JobsNetworkPolicyName}, Verbs: change},
		{APIGroups: []string{""}, Resources: []string{"pods", "events"}, Verbs: []string{"get", "list", "watch"}},
		// The controller's informers (Run): it asks only for its own
		// labels, but RBAC cannot limit a list by label.
		{APIGroups: []string{""}, Resources: []string{"serviceaccounts", "services", "persistentvolumeclaims", "resourcequotas"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"roles", "rolebindings"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"list", "watch"}},
		named("discovery.k8s.io", "endpointslices", "kubernetes", "get"),
		{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"},
			ResourceNames: []string{JobPolicyName, ScopePolicyName}, Verbs: []string{"get"}},
	}
	rules = append(rules, WorkerRules()...)
	return &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: ClusterRoleName, Labels: map[string]string{LabelPartOf: PartOf}},
		Rules:      rules,
	}
}
