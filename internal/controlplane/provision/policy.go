package provision

import (
	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// JobPolicyName names the ValidatingAdmissionPolicy (and its binding) that
// keeps the Jobs a worker creates unprivileged.
const JobPolicyName = "talkide-worker-jobs"

// The worker's namespace must allow its own pod what Pod Security's
// "baseline" refuses (see namespaceObject), and its Role lets it create
// Jobs. Without more, a compromised worker could run a privileged Job, or
// one with a hostPath or the node's network or PID namespace, and leave
// its node. This policy, matched to requests of every talkide-worker
// ServiceAccount in the provisioner's namespaces, refuses such Jobs: a
// worker's Jobs get what "baseline" gives, no more.
//
// JobPolicy is installed by an administrator with ClusterRole and
// ScopePolicy (`talkide-controlplane clusterrole`); a provisioner with
// rights to admission policies (an administrator's kubeconfig) applies it
// itself, and one without refuses to provision until it exists.
func JobPolicy() (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding) {
	const spec = "object.spec.template.spec"
	containers := "(" + spec + ".containers + (has(" + spec + ".initContainers) ? " + spec + ".initContainers : []))"
	forbidden := ptr.To(metav1.StatusReasonForbidden)
	validations := []admissionv1.Validation{
		{Expression: "!has(" + spec + ".hostNetwork) || !" + spec + ".hostNetwork", Message: "a worker's Job may not use the node's network"},
		{Expression: "!has(" + spec + ".hostPID) || !" + spec + ".hostPID", Message: "a worker's Job may not use the node's PID namespace"},
		{Expression: "!has(" + spec + ".hostIPC) || !" + spec + ".hostIPC", Message: "a worker's Job may not use the node's IPC namespace"},
		{Expression: "!has(" + spec + ".volumes) || " + spec + ".volumes.all(v, !has(v.hostPath))", Message: "a worker's Job may not mount a hostPath"},
		{Expression: "!has(" + spec + ".volumes) || " + spec + ".volumes.all(v, has(v.emptyDir) || has(v.configMap) || has(v.downwardAPI) || has(v.persistentVolumeClaim) || " +
			"(has(v.secret) && v.secret.secretName != '" + SecretName + "') || " +
			"(has(v.projected) && (!has(v.projected.sources) || v.projected.sources.all(x, has(x.configMap) || has(x.downwardAPI) || (has(x.secret) && x.secret.name != '" + SecretName + "')))))",
			Message: "a worker's Job may mount only emptyDir, configMap, downwardAPI, persistentVolumeClaim and secret volumes (not the worker's own Secret, no ephemeral, network, CSI or image volumes, no ServiceAccount token)"},
		{Expression: "!has(" + spec + ".resourceClaims) && (!has(" + spec + ".runtimeClassName) || " + spec + ".runtimeClassName == '')",
			Message: "a worker's Job may not claim devices or pick a runtime class"},
		{Expression: "(!has(" + spec + ".serviceAccountName) || " + spec + ".serviceAccountName in ['', 'default']) && (!has(" + spec + ".serviceAccount) || " + spec + ".serviceAccount in ['', 'default'])",
			Message: "a worker's Job runs as the namespace's default ServiceAccount, never as the worker"},
		{Expression: "!has(object.spec.template.metadata) || !has(object.spec.template.metadata.labels) || !('" + LabelName + "' in object.spec.template.metadata.labels) || object.spec.template.metadata.labels['" + LabelName + "'] != '" + WorkerName + "'",
			Message: "a worker's Job may not carry the worker's labels (its NetworkPolicy and Service)"},
		{Expression: "(!has(" + spec + ".nodeSelector) || !('kubernetes.io/hostname' in " + spec + ".nodeSelector)) && !has(" + spec + ".affinity)",
			Message: "a worker's Job may not pick its node by name or place itself by affinity"},
		{Expression: "!has(" + spec + ".volumes) || " + spec + ".volumes.all(v, !has(v.persistentVolumeClaim) || v.persistentVolumeClaim.claimName == '" + PVCName + "')",
			Message: "a worker's Job may mount no claim but the session volume's"},
		{Expression: "(!has(object.spec.parallelism) || object.spec.parallelism <= 4) && (!has(object.spec.completions) || object.spec.completions <= 4) && (!has(object.spec.backoffLimit) || object.spec.backoffLimit <= 6)",
			Message: "a worker's Job may run at most 4 pods in parallel and to completion, retried at most 6 times"},
		{Expression: containers + ".all(c, (!has(c.env) || c.env.all(e, !has(e.valueFrom) || !has(e.valueFrom.secretKeyRef) || e.valueFrom.secretKeyRef.name != '" + SecretName + "')) && " +
			"(!has(c.envFrom) || c.envFrom.all(e, !has(e.secretRef) || e.secretRef.name != '" + SecretName + "')))",
			Message: "a worker's Job may not read the worker's own Secret"},
		{Expression: "!has(" + spec + ".nodeName) || " + spec + ".nodeName == ''", Message: "a worker's Job may not pick its node (nodeName)"},
		{Expression: "!has(" + spec + ".priorityClassName) || " + spec + ".priorityClassName == ''", Message: "a worker's Job may not set a priority class (it could preempt other tenants' workers)"},
		{Expression: "!has(" + spec + ".tolerations) || " + spec + ".tolerations.all(t, has(t.key) && t.key != '' && !t.key.startsWith('node.') && !t.key.startsWith('node-role.kubernetes.io/') && t.key != 'CriticalAddonsOnly')",
			Message: "a worker's Job may not tolerate every taint, nor the taints of unhealthy, uninitialized, control-plane or critical-addon nodes"},
		{Expression: "!has(" + spec + ".securityContext) || ((!has(" + spec + ".securityContext.seccompProfile) || " + spec + ".securityContext.seccompProfile.type != 'Unconfined') && " +
			"(!has(" + spec + ".securityContext.appArmorProfile) || " + spec + ".securityContext.appArmorProfile.type != 'Unconfined') && " +
			"(!has(" + spec + ".securityContext.seLinuxOptions) || (!has(" + spec + ".securityContext.seLinuxOptions.user) && !has(" + spec + ".securityContext.seLinuxOptions.role) && (!has(" + spec + ".securityContext.seLinuxOptions.type) || " + spec + ".securityContext.seLinuxOptions.type in ['', 'container_t', 'container_init_t', 'container_kvm_t', 'container_engine_t']))) && " +
			"(!has(" + spec + ".securityContext.sysctls) || " + spec + ".securityContext.sysctls.all(x, x.name in ['kernel.shm_rmid_forced', 'net.ipv4.ip_local_port_range', 'net.ipv4.ip_unprivileged_port_start', 'net.ipv4.tcp_syncookies', 'net.ipv4.ping_group_range', 'net.ipv4.ip_local_reserved_ports', 'net.ipv4.tcp_keepalive_time', 'net.ipv4.tcp_fin_timeout', 'net.ipv4.tcp_keepalive_intvl', 'net.ipv4.tcp_keepalive_probes'])))",
			Message: "a worker's Job may not run without seccomp or AppArmor, with another SELinux type, or with unsafe sysctls"},
		{Expression: "!has(object.spec.template.metadata) || !has(object.spec.template.metadata.annotations) || object.spec.template.metadata.annotations.all(k, !k.startsWith('container.apparmor.security.beta.kubernetes.io/') || object.spec.template.metadata.annotations[k] != 'unconfined')",
			Message: "a worker's Job may not run without AppArmor"},
		{Expression: containers + ".all(c, !has(c.securityContext) || ((!has(c.securityContext.privileged) || !c.securityContext.privileged) && " +
			"(!has(c.securityContext.capabilities) || !has(c.securityContext.capabilities.add) || c.securityContext.capabilities.add.all(x, x in ['AUDIT_WRITE','CHOWN','DAC_OVERRIDE','FOWNER','FSETID','KILL','MKNOD','NET_BIND_SERVICE','SETFCAP','SETGID','SETPCAP','SETUID','SYS_CHROOT'])) && " +
			"(!has(c.securityContext.procMount) || c.securityContext.procMount == 'Default') && " +
			"(!has(c.securityContext.seccompProfile) || c.securityContext.seccompProfile.type != 'Unconfined') && " +
			"(!has(c.securityContext.appArmorProfile) || c.securityContext.appArmorProfile.type != 'Unconfined') && " +
			"(!has(c.securityContext.seLinuxOptions) || (!has(c.securityContext.seLinuxOptions.user) && !has(c.securityContext.seLinuxOptions.role) && (!has(c.securityContext.seLinuxOptions.type) || c.securityContext.seLinuxOptions.type in ['', 'container_t', 'container_init_t', 'container_kvm_t', 'container_engine_t'])))))",
			Message: "a worker's Job may not run privileged containers, add capabilities beyond Pod Security's baseline, unmask /proc, run without seccomp or AppArmor, or with another SELinux type"},
		{Expression: containers + ".all(c, !has(c.ports) || c.ports.all(p, !has(p.hostPort) || p.hostPort == 0))", Message: "a worker's Job may not use host ports"},
	}
	for i := range validations {
		validations[i].Reason = forbidden
	}
	pol := &admissionv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: JobPolicyName, Labels: map[string]string{LabelManagedBy: ManagedBy, LabelPartOf: PartOf}},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{
				ResourceRules: []admissionv1.NamedRuleWithOperations{{RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
					Rule:       admissionv1.Rule{APIGroups: []string{"batch"}, APIVersions: []string{"*"}, Resources: []string{"jobs"}},
				}}},
			},
			Validations: validations,
		},
	}
	bind := &admissionv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: JobPolicyName, Labels: map[string]string{LabelManagedBy: ManagedBy, LabelPartOf: PartOf}},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        JobPolicyName,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy}},
			},
		},
	}
	return pol, bind
}

// Where the node-wide agent uid claims may live (Config.HostUIDDir): the
// only hostPath a worker's Deployment may mount.
const (
	hostUIDPrefixRun = "/run/talkide/"
	hostUIDPrefixVar = "/var/lib/talkide/"
)

// ScopePolicyName names the ValidatingAdmissionPolicy (and its binding)
// that confines the control plane's writes to its own namespaces.
const ScopePolicyName = "talkide-controlplane-scope"

// ScopePolicy confines what a ServiceAccount named talkide-controlplane
// may change (RBAC cannot: it grants a verb on a resource in every
// namespace or by name only): objects only in namespaces labelled as the
// provisioner's; namespaces it may create, but change or delete only its
// own. Install it with ClusterRole and JobPolicy, by an administrator: the
// control plane may not change admission policies (Kubernetes does not
// subject those to admission, so only RBAC guards them). Reads are not
// admission-controlled; ClusterRole keeps those narrow.
func ScopePolicy() (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding) {
	managed := func(o string) string {
		return o + " != null && has(" + o + ".metadata.labels) && '" + LabelManagedBy + "' in " + o + ".metadata.labels && " + o + ".metadata.labels['" + LabelManagedBy + "'] == '" + ManagedBy + "'"
	}
	forbidden := ptr.To(metav1.StatusReasonForbidden)
	deployment := "request.resource.resource != 'deployments' || (has(request.subResource) && request.subResource != '') || request.operation == 'DELETE'"
	const tmpl = "object.spec.template.spec"
	pol := &admissionv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: ScopePolicyName, Labels: map[string]string{LabelPartOf: PartOf}},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{
				ResourceRules: []admissionv1.NamedRuleWithOperations{{RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update, admissionv1.Delete, admissionv1.Connect},
					Rule:       admissionv1.Rule{APIGroups: []string{"*"}, APIVersions: []string{"*"}, Resources: []string{"*/*"}},
				}}},
			},
			MatchConditions: []admissionv1.MatchCondition{{
				Name:       "by-the-control-plane",
				Expression: "request.userInfo.username.startsWith('system:serviceaccount:') && request.userInfo.username.endsWith(':" + ControlPlaneServiceAccount + "')",
			}},
			Validations: []admissionv1.Validation{
				{Expression: "request.resource.resource == 'namespaces' || request.namespace == '' || (" + managed("namespaceObject") + ")", Reason: forbidden,
					Message: "the TalkIDE control plane may change objects only in the namespaces it made"},
				{Expression: "request.resource.resource != 'namespaces' || request.operation == 'CREATE' || (" + managed("oldObject") + " && (request.operation == 'DELETE' || " + managed("object") + "))",
					Reason: forbidden, Message: "the TalkIDE control plane may change or delete only the namespaces it made"},
				// In its namespaces it makes only the worker's objects,
				// by name: no other ServiceAccount, no binding to anyone
				// else, no ServiceAccount token Secret, no Role granting
				// more than the worker's rights.
				{Expression: "request.resource.resource == 'namespaces' || request.namespace == '' || request.operation == 'DELETE' || request.name in ['" + WorkerName + "', '" + SecretName + "', '" + JobsNetworkPolicyName + "', '" + PVCName + "']",
					Reason: forbidden, Message: "the TalkIDE control plane may make only the worker's objects (by name) in its namespaces"},
				{Expression: "request.resource.resource != 'secrets' || request.operation == 'DELETE' || !has(object.type) || object.type == 'Opaque'",
					Reason: forbidden, Message: "the TalkIDE control plane may make only Opaque Secrets"},
				{Expression: "request.resource.resource != 'persistentvolumeclaims' || request.operation == 'DELETE' || " +
					"((!has(object.spec.volumeName) || object.spec.volumeName == '') && !has(object.spec.dataSource) && !has(object.spec.dataSourceRef))",
					Reason: forbidden, Message: "the TalkIDE control plane may claim only a new volume (no volumeName, no data source)"},
				{Expression: "request.resource.resource != 'services' || request.operation == 'DELETE' || " +
					"((!has(object.spec.type) || object.spec.type == 'ClusterIP') && (!has(object.spec.externalIPs) || size(object.spec.externalIPs) == 0))",
					Reason: forbidden, Message: "the TalkIDE control plane may make only ClusterIP Services without external IPs"},
				{Expression: "request.resource.resource != 'rolebindings' || request.operation == 'DELETE' || (object.roleRef.kind == 'Role' && object.roleRef.name == '" + WorkerName + "' && has(object.subjects) && " +
					"object.subjects.all(x, x.kind == 'ServiceAccount' && x.name == '" + WorkerName + "' && has(x.namespace) && x.namespace == request.namespace))",
					Reason: forbidden, Message: "the TalkIDE control plane may bind only the worker's Role to the worker's ServiceAccount"},
				{Expression: "request.resource.resource != 'roles' || request.operation == 'DELETE' || !has(object.rules) || object.rules.all(r, !has(r.resourceNames) && (!has(r.nonResourceURLs) || size(r.nonResourceURLs) == 0) && (" +
					"(r.apiGroups == ['batch'] && r.resources == ['jobs'] && r.verbs.all(v, v in ['create', 'get', 'list', 'watch', 'delete'])) || " +
					"(r.apiGroups == [''] && r.resources.all(x, x in ['pods', 'pods/log']) && r.verbs.all(v, v in ['get', 'list', 'watch'])) || " +
					"(r.apiGroups == [''] && r.resources == ['events'] && r.verbs == ['list']) || " +
					"(r.apiGroups == ['coordination.k8s.io'] && r.resources == ['leases'] && r.verbs.all(v, v in ['get', 'create', 'update', 'delete']))))",
					Reason: forbidden, Message: "the TalkIDE control plane may grant a worker only the worker's rights"},
				// The worker's pod needs more than baseline (see
				// workerPodSpec), but never the node's: its Deployments
				// have no host namespace, no privileged container, no
				// capability beyond baseline's but SYS_ADMIN in a user
				// namespace of the pod's own (hostUsers: false), no
				// hostPath but the uid claims', and tolerate no taint of
				// unhealthy, control-plane or system nodes.
				{Expression: deployment + " || (" +
					"(!has(" + tmpl + ".hostNetwork) || !" + tmpl + ".hostNetwork) && (!has(" + tmpl + ".hostPID) || !" + tmpl + ".hostPID) && (!has(" + tmpl + ".hostIPC) || !" + tmpl + ".hostIPC) && " +
					"(!has(" + tmpl + ".nodeName) || " + tmpl + ".nodeName == '') && (!has(" + tmpl + ".priorityClassName) || " + tmpl + ".priorityClassName == '') && " +
					"(!has(" + tmpl + ".tolerations) || " + tmpl + ".tolerations.all(t, has(t.key) && t.key != '' && !t.key.startsWith('node.') && !t.key.startsWith('node-role.kubernetes.io/') && t.key != 'CriticalAddonsOnly')) && " +
					"(!has(" + tmpl + ".serviceAccountName) || " + tmpl + ".serviceAccountName == '" + WorkerName + "') && " +
					"(!has(" + tmpl + ".volumes) || " + tmpl + ".volumes.all(v, has(v.emptyDir) || has(v.configMap) || " +
					"(has(v.persistentVolumeClaim) && v.persistentVolumeClaim.claimName == '" + PVCName + "') || (has(v.secret) && v.secret.secretName == '" + SecretName + "') || " +
					"(has(v.hostPath) && (v.hostPath.path.startsWith('" + hostUIDPrefixRun + "') || v.hostPath.path.startsWith('" + hostUIDPrefixVar + "'))))) && " +
					"(!has(" + tmpl + ".nodeSelector) || !('kubernetes.io/hostname' in " + tmpl + ".nodeSelector)) && !has(" + tmpl + ".affinity) && " +
					"(" + tmpl + ".containers + (has(" + tmpl + ".initContainers) ? " + tmpl + ".initContainers : [])).all(c, !has(c.ports) || c.ports.all(p, !has(p.hostPort) || p.hostPort == 0)) && " +
					"(" + tmpl + ".containers + (has(" + tmpl + ".initContainers) ? " + tmpl + ".initContainers : [])).all(c, !has(c.securityContext) || ((!has(c.securityContext.privileged) || !c.securityContext.privileged) && " +
					"(!has(c.securityContext.capabilities) || !has(c.securityContext.capabilities.add) || c.securityContext.capabilities.add.all(x, x in ['AUDIT_WRITE','CHOWN','DAC_OVERRIDE','FOWNER','FSETID','KILL','MKNOD','NET_BIND_SERVICE','SETFCAP','SETGID','SETPCAP','SETUID','SYS_CHROOT'] || " +
					"(x == 'SYS_ADMIN' && has(" + tmpl + ".hostUsers) && !" + tmpl + ".hostUsers))))))",
					Reason: forbidden, Message: "the TalkIDE control plane may run Deployments only as its workers run: unprivileged, with no host namespace, no capability beyond baseline's (SYS_ADMIN only in a user namespace of the pod's own), no hostPath but the agent uid claims', no taint of unhealthy, control-plane or system nodes tolerated"},
			},
		},
	}
	bind := &admissionv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: ScopePolicyName, Labels: map[string]string{LabelPartOf: PartOf}},
		Spec:       admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: ScopePolicyName, ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny}},
	}
	return pol, bind
}
