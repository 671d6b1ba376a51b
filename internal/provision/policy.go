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
func jobPolicyObjects(c *Config) (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding) {
	const spec = "object.spec.template.spec"
	containers := "(" + spec + ".containers + (has(" + spec + ".initContainers) ? " + spec + ".initContainers : []))"
	forbidden := ptr.To(metav1.StatusReasonForbidden)
	validations := []admissionv1.Validation{
		{Expression: "!has(" + spec + ".hostNetwork) || !" + spec + ".hostNetwork", Message: "a worker's Job may not use the node's network"},
		{Expression: "!has(" + spec + ".hostPID) || !" + spec + ".hostPID", Message: "a worker's Job may not use the node's PID namespace"},
		{Expression: "!has(" + spec + ".hostIPC) || !" + spec + ".hostIPC", Message: "a worker's Job may not use the node's IPC namespace"},
		{Expression: "!has(" + spec + ".volumes) || " + spec + ".volumes.all(v, !has(v.hostPath))", Message: "a worker's Job may not mount a hostPath"},
		{Expression: "!has(" + spec + ".securityContext) || !has(" + spec + ".securityContext.seccompProfile) || " + spec + ".securityContext.seccompProfile.type != 'Unconfined'",
			Message: "a worker's Job may not run without seccomp"},
		{Expression: containers + ".all(c, !has(c.securityContext) || ((!has(c.securityContext.privileged) || !c.securityContext.privileged) && " +
			"(!has(c.securityContext.capabilities) || !has(c.securityContext.capabilities.add) || c.securityContext.capabilities.add.all(x, x in ['AUDIT_WRITE','CHOWN','DAC_OVERRIDE','FOWNER','FSETID','KILL','MKNOD','NET_BIND_SERVICE','SETFCAP','SETGID','SETPCAP','SETUID','SYS_CHROOT'])) && " +
			"(!has(c.securityContext.procMount) || c.securityContext.procMount == 'Default') && " +
			"(!has(c.securityContext.seccompProfile) || c.securityContext.seccompProfile.type != 'Unconfined')))",
			Message: "a worker's Job may not run privileged containers, add capabilities beyond Pod Security's baseline, unmask /proc or run without seccomp"},
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
			MatchConditions: []admissionv1.MatchCondition{{
				Name:       "by-a-worker",
				Expression: "request.userInfo.username.startsWith('system:serviceaccount:') && request.userInfo.username.endsWith(':" + WorkerName + "')",
			}},
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
