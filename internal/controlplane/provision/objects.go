package provision

import (
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// The desired objects of a tenant-env's worker. Each is applied whole with
// server-side apply (field manager FieldManager), so applying it again
// changes nothing and a field an operator added by hand that the
// provisioner does not own stays.

// FieldManager is the provisioner's server-side apply field manager.
const FieldManager = "talkide-provisioner"

func meta(c *Config, tenant, env, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: Namespace(tenant, env), Labels: c.labels(tenant, env)}
}

func namespaceObject(c *Config, tenant, env string) *corev1.Namespace {
	l := c.labels(tenant, env)
	// The worker's pods need what Pod Security's "baseline" refuses
	// (seccomp and AppArmor unconfined, an unmasked /proc) to build the
	// agents' jails; they run in a user namespace (hostUsers: false), so
	// root in them is not root on the node. docs/deploying.md says more.
	l["pod-security.kubernetes.io/enforce"] = "privileged"
	l["pod-security.kubernetes.io/warn"] = "privileged"
	return &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: Namespace(tenant, env), Labels: l},
	}
}

func secretObject(c *Config, tenant, env, identityToken, requestKeys string) *corev1.Secret {
	return &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: meta(c, tenant, env, SecretName),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{SecretKeyID: []byte(identityToken), SecretKeyReq: []byte(requestKeys)},
	}
}

func serviceAccountObject(c *Config, tenant, env string) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: meta(c, tenant, env, WorkerName),
	}
}

func roleObject(c *Config, tenant, env string) *rbacv1.Role {
	return &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: meta(c, tenant, env, WorkerName),
		Rules:      WorkerRules(),
	}
}

func roleBindingObject(c *Config, tenant, env string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: meta(c, tenant, env, WorkerName),
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: WorkerName, Namespace: Namespace(tenant, env)}},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: WorkerName},
	}
}

func pvcObject(c *Config, tenant, env string) *corev1.PersistentVolumeClaim {
	p := &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: meta(c, tenant, env, PVCName),
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: c.StorageSize}},
		},
	}
	if c.StorageClass != "" {
		p.Spec.StorageClassName = ptr.To(c.StorageClass)
	}
	return p
}

func serviceObject(c *Config, tenant, env string) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: meta(c, tenant, env, WorkerName),
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP, // owned: an edit to NodePort is undone
			Selector: podSelector(tenant, env),
			Ports:    []corev1.ServicePort{{Name: "http", Port: WorkerPort, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}},
		},
	}
}

// networkPolicyObject lets only the control plane's pods (and the worker's
// own replicas, which forward requests to a conversation's owner) reach the
// worker, and the worker reach only the control plane, DNS, the API server,
// its replicas and the operator's EgressCIDRs.
func networkPolicyObject(c *Config, tenant, env string, apiServer []string) *networkingv1.NetworkPolicy {
	cp := networkingv1.NetworkPolicyPeer{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": c.ControlPlaneNamespace}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: c.ControlPlaneLabels},
	}
	self := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: podSelector(tenant, env)}}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	workerPort := intstr.FromInt32(WorkerPort)
	dns := intstr.FromInt32(53)
	egress := []networkingv1.NetworkPolicyEgressRule{
		{To: []networkingv1.NetworkPolicyPeer{cp}},
		{To: []networkingv1.NetworkPolicyPeer{self}, Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &workerPort}}},
		{
			To: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
			}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}},
		},
	}
	if r := cidrRule(apiServer); r != nil {
		egress = append(egress, *r)
	}
	if r := cidrRule(c.EgressCIDRs); r != nil {
		egress = append(egress, *r)
	}
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: meta(c, tenant, env, WorkerName),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: podSelector(tenant, env)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{cp, self},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &workerPort}},
			}},
			Egress: egress,
		},
	}
}

func cidrRule(cidrs []string) *networkingv1.NetworkPolicyEgressRule {
	if len(cidrs) == 0 {
		return nil
	}
	r := &networkingv1.NetworkPolicyEgressRule{}
	for _, c := range cidrs {
		r.To = append(r.To, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: c}})
	}
	return r
}

// deploymentObject is the worker's Deployment: the one definition of the
// worker's pod. secretHash changes when the request keys do (they reach
// the worker as an environment variable, so a change rolls the pods; the
// identity token is a mounted file the worker re-reads and does not).
func deploymentObject(c *Config, tenant, env, secretHash string) *appsv1.Deployment {
	maxSurge, maxUnavailable := intstr.FromInt32(1), intstr.FromInt32(0)
	env_ := []corev1.EnvVar{
		{Name: "TALKIDE_TENANT", Value: tenant},
		{Name: "TALKIDE_ENV", Value: env},
		{Name: "TALKIDE_WORKER_ADDR", Value: ":" + strconv.Itoa(WorkerPort)},
		{Name: "TALKIDE_GATEWAY_BASE_URL", Value: c.GatewayURL},
		{Name: "TALKIDE_SESSION_DIR", Value: SessionMount},
		{Name: "TALKIDE_WORKER_IDENTITY_TOKEN_FILE", Value: IdentityMount + "/" + SecretKeyID},
		{Name: "TALKIDE_WORKER_REQUEST_KEYS", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: SecretName}, Key: SecretKeyReq}}},
		{Name: "TALKIDE_LEASE_BACKEND", Value: "kubernetes"},
		{Name: "TALKIDE_CONTAINMENT", Value: "strict"},
		{Name: "TALKIDE_WORKER_ID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
		{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
	}
	if c.BuildImage != "" {
		env_ = append(env_, corev1.EnvVar{Name: "TALKIDE_BUILD_IMAGE", Value: c.BuildImage})
	}
	if len(c.ContainmentRequire) > 0 {
		env_ = append(env_, corev1.EnvVar{Name: "TALKIDE_CONTAINMENT_REQUIRE", Value: strings.Join(c.ContainmentRequire, ",")})
	}
	env_ = append(env_, c.Env...)
	probe := func(path string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("http")}},
			PeriodSeconds:    period,
			FailureThreshold: failures,
			TimeoutSeconds:   2,
		}
	}
	podLabels := podSelector(tenant, env)
	for k, v := range c.labels(tenant, env) {
		podLabels[k] = v
	}
	pod := workerPodSpec(c, env_)
	pod.Containers[0].Image = c.Image
	pod.Containers[0].ImagePullPolicy = c.ImagePullPolicy
	pod.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: WorkerPort, Protocol: corev1.ProtocolTCP}}
	pod.Containers[0].Resources = c.Resources
	pod.Containers[0].StartupProbe = probe("/healthz", 2, 60)
	pod.Containers[0].ReadinessProbe = probe("/readyz", 5, 2)
	pod.Containers[0].LivenessProbe = probe("/healthz", 10, 6)
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: meta(c, tenant, env, WorkerName),
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(c.Replicas),
			Selector: &metav1.LabelSelector{MatchLabels: podSelector(tenant, env)},
			// One extra replica during an update, none fewer: the new
			// one takes conversations over through their leases while
			// the old one finishes its turns (TALKIDE_SHUTDOWN_GRACE).
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
				MaxSurge: &maxSurge, MaxUnavailable: &maxUnavailable}},
			ProgressDeadlineSeconds: ptr.To[int32](600),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: map[string]string{"talkide.dev/secret-hash": secretHash}},
				Spec:       pod,
			},
		},
	}
}

// workerCapabilities are what the worker's root keeps (all others are
// dropped): giving each agent its uid (SETUID, SETGID), its directories
// (CHOWN, FOWNER, DAC_OVERRIDE) and ending its processes (KILL). bubblewrap
// runs as the agent and builds the jail in a user namespace of the agent's
// own, so the worker needs no SYS_ADMIN.
var workerCapabilities = []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"}

// workerPodSpec is the worker pod's security-relevant spec: the one place
// its security context is written (docs/deploying.md, "Choosing the
// worker's pod"). With c.UserNamespace the pod runs in a user namespace of
// its own with an unmasked /proc; without, it runs in the node's, so any
// session volume mounts (NFS has no idmapped mounts), its agents see the
// pod's /proc, and node-wide uid claims (a hostPath) keep two workers of a
// node from sharing an agent uid. Either way seccomp and AppArmor are
// unconfined: bubblewrap creates user namespaces, which runtimes' default
// profiles forbid.
func workerPodSpec(c *Config, env []corev1.EnvVar) corev1.PodSpec {
	sc := &corev1.SecurityContext{
		RunAsUser:                ptr.To[int64](0),
		RunAsNonRoot:             ptr.To(false),
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: workerCapabilities},
	}
	mounts := []corev1.VolumeMount{
		{Name: "sessions", MountPath: SessionMount},
		{Name: "identity", MountPath: IdentityMount, ReadOnly: true},
	}
	volumes := []corev1.Volume{
		{Name: "sessions", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: PVCName}}},
		{Name: "identity", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: SecretName, Items: []corev1.KeyToPath{{Key: SecretKeyID, Path: SecretKeyID}}, DefaultMode: ptr.To[int32](0o400)}}},
	}
	if c.UserNamespace {
		// bubblewrap mounts a private /proc per agent: the container's
		// must not be masked (allowed only in a user namespace).
		sc.ProcMount = ptr.To(corev1.UnmaskedProcMount)
		env = append(env, corev1.EnvVar{Name: "TALKIDE_HOST_UID_DIR", Value: "none"})
	} else {
		hostPathType := corev1.HostPathDirectoryOrCreate
		env = append(env, corev1.EnvVar{Name: "TALKIDE_HOST_UID_DIR", Value: c.HostUIDDir})
		mounts = append(mounts, corev1.VolumeMount{Name: "host-uids", MountPath: c.HostUIDDir})
		volumes = append(volumes, corev1.Volume{Name: "host-uids", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: c.HostUIDDir, Type: &hostPathType}}})
	}
	spec := corev1.PodSpec{
		ServiceAccountName:            WorkerName,
		AutomountServiceAccountToken:  ptr.To(true), // Leases, and build Jobs
		TerminationGracePeriodSeconds: ptr.To[int64](30),
		HostUsers:                     ptr.To(!c.UserNamespace),
		SecurityContext: &corev1.PodSecurityContext{
			SeccompProfile:  &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined},
			AppArmorProfile: &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined},
		},
		NodeSelector: c.NodeSelector,
		Tolerations:  c.Tolerations,
		Containers: []corev1.Container{{
			Name:            "worker",
			Env:             env,
			SecurityContext: sc,
			VolumeMounts:    mounts,
			// A worker that refuses to start says why in its last log
			// lines: they become the termination message the status shows.
			TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		}},
		Volumes: volumes,
	}
	if c.RuntimeClass != "" {
		spec.RuntimeClassName = ptr.To(c.RuntimeClass)
	}
	return spec
}

// JobsNetworkPolicyName names the NetworkPolicy of every other pod of the
// namespace (the worker's build Jobs).
const JobsNetworkPolicyName = "talkide-jobs"

// jobsNetworkPolicyObject covers every pod of the namespace that is not the
// worker: nothing may reach it, and it reaches only DNS and the operator's
// EgressCIDRs (a package mirror, say), never the control plane, the API
// server or the worker.
func jobsNetworkPolicyObject(c *Config, tenant, env string) *networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	dns := intstr.FromInt32(53)
	egress := []networkingv1.NetworkPolicyEgressRule{{
		To: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
		}},
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}},
	}}
	if r := cidrRule(c.EgressCIDRs); r != nil {
		egress = append(egress, *r)
	}
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: meta(c, tenant, env, JobsNetworkPolicyName),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: LabelName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{WorkerName}},
			}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Egress:      egress,
		},
	}
}

// QuotaName names the namespace's ResourceQuota.
const QuotaName = "talkide-worker"

// quotaObject bounds what the namespace may hold however its worker
// behaves: a compromised worker cannot flood the cluster with Jobs or pods.
// Counts only, so no pod has to declare resources for it.
func quotaObject(c *Config, tenant, env string) *corev1.ResourceQuota {
	return &corev1.ResourceQuota{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ResourceQuota"},
		ObjectMeta: meta(c, tenant, env, QuotaName),
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
			"count/jobs.batch":  *resource.NewQuantity(int64(c.MaxJobs), resource.DecimalSI),
			corev1.ResourcePods: *resource.NewQuantity(int64(c.MaxJobs)+2*int64(c.Replicas)+2, resource.DecimalSI),
		}},
	}
}
