package provision_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/talkide/talkide/internal/controlplane/provision"
)

// The control plane provisions, rotates and deprovisions with exactly the
// ClusterRole, and without one of its rules it cannot.
func TestControlPlaneWorksWithExactlyItsClusterRole(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	installScopePolicy(t, r)
	cpNS := r.cluster.Namespace(t)
	kube := r.serviceAccountWith(t, cpNS, provision.ControlPlaneServiceAccount, provision.ClusterRole().Rules)
	p := r.another(kube)
	// Its controller can watch everything it watches with these rights.
	r.run(p)
	tn := r.tenant()
	if _, err := p.Provision(ctx, tn, "dev"); err != nil {
		t.Fatalf("provision as the control plane's ServiceAccount: %v", err)
	}
	st := r.waitPhase(tn, "dev", provision.PhaseReady)
	if st2, err := p.Status(ctx, tn, "dev"); err != nil || st2.Phase != st.Phase {
		t.Fatalf("status as the ServiceAccount: %+v %v", st2, err)
	}
	if _, err := p.RotateIdentity(ctx, tn, "dev"); err != nil {
		t.Fatal(err)
	}

	// Outside the namespaces it made, it can read no Secret and change
	// nothing: the escalation through a ServiceAccount token Secret in
	// kube-system, deleting a namespace, or a new admission policy.
	foreign := r.cluster.Namespace(t)
	tokenSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: provision.SecretName,
		Annotations: map[string]string{corev1.ServiceAccountNameKey: "clusterrole-aggregation-controller"}}, Type: corev1.SecretTypeServiceAccountToken}
	denied := map[string]error{}
	_, denied["create a token Secret in kube-system"] = kube.CoreV1().Secrets("kube-system").Create(ctx, tokenSecret, metav1.CreateOptions{})
	_, denied["read a Secret of another name"] = kube.CoreV1().Secrets("kube-system").Get(ctx, "anything", metav1.GetOptions{})
	_, denied["list Secrets"] = kube.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	denied["delete a namespace it did not make"] = kube.CoreV1().Namespaces().Delete(ctx, foreign, metav1.DeleteOptions{})
	// (valid objects: the API server validates them before admission)
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: provision.WorkerName}, Spec: appsv1.DeploymentSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"a": "b"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "x"}}}}}}
	_, denied["create a Deployment elsewhere"] = kube.AppsV1().Deployments(foreign).Create(ctx, dep, metav1.CreateOptions{})
	_, denied["create a Role elsewhere"] = kube.RbacV1().Roles(foreign).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: provision.WorkerName}}, metav1.CreateOptions{})
	other, _ := provision.ScopePolicy()
	other.Name = "deny-all"
	_, denied["create an admission policy"] = kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, other, metav1.CreateOptions{})
	_, denied["change the policy that confines it"] = kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Update(ctx, other, metav1.UpdateOptions{})
	for what, err := range denied {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", what, err)
		}
	}
	// In its own namespaces it makes only the worker's objects: no other
	// ServiceAccount (which no Job policy would watch), no token Secret,
	// no binding to anyone else, no Role beyond the worker's rights.
	own := tn + "-dev"
	denied = map[string]error{}
	_, denied["another ServiceAccount"] = kube.CoreV1().ServiceAccounts(own).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "foo"}}, metav1.CreateOptions{})
	wtok := tokenSecret.DeepCopy()
	wtok.Annotations[corev1.ServiceAccountNameKey] = provision.WorkerName
	_, denied["a token Secret of the worker's name"] = kube.CoreV1().Secrets(own).Create(ctx, wtok, metav1.CreateOptions{})
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: provision.WorkerName + "-2"}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: provision.WorkerName},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "default", Namespace: own}}}
	_, denied["a RoleBinding of another name"] = kube.RbacV1().RoleBindings(own).Create(ctx, rb, metav1.CreateOptions{})
	role, err := kube.RbacV1().Roles(own).Get(ctx, provision.WorkerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, Verbs: []string{"create"}})
	_, denied["a Role granting more than the worker's rights"] = kube.RbacV1().Roles(own).Update(ctx, role, metav1.UpdateOptions{})
	stolen := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: provision.PVCName}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeName: "someone-elses",
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	_, denied["a claim of another's volume"] = kube.CoreV1().PersistentVolumeClaims(own).Create(ctx, stolen, metav1.CreateOptions{})
	svc, err := kube.CoreV1().Services(own).Get(ctx, provision.WorkerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.ExternalIPs = []string{"10.0.0.99"}
	_, denied["a Service with external IPs"] = kube.CoreV1().Services(own).Update(ctx, svc, metav1.UpdateOptions{})
	for what, err := range denied {
		if !apierrors.IsForbidden(err) {
			t.Errorf("in its own namespace, %s: %v, want Forbidden", what, err)
		}
	}
	if err := denied["a claim of another's volume"]; err == nil || !strings.Contains(err.Error(), "only a new volume") {
		t.Errorf("a claim of another's volume: %v, want the scope policy's refusal", err)
	}
	if err := denied["a Service with external IPs"]; err == nil || !strings.Contains(err.Error(), "ClusterIP Services") {
		t.Errorf("a Service with external IPs: %v, want the scope policy's refusal", err)
	}

	// In its own namespaces it may run Deployments only as workers run:
	// another Deployment is refused by name, and the worker's own cannot
	// be turned into an escape.
	another := dep.DeepCopy()
	another.Name = "not-the-worker"
	if _, err := kube.AppsV1().Deployments(own).Create(ctx, another, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), provision.ScopePolicyName) {
		t.Errorf("another Deployment in its own namespace: %v, want Forbidden by the scope policy", err)
	}
	for name, mutate := range map[string]func(*corev1.PodSpec){
		"mounting the node's /": func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		},
		"privileged": func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.Privileged = ptr.To(true)
			s.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
		},
		"on a node of choice": func(s *corev1.PodSpec) { s.NodeName = "fake-node-0" },
		"critical priority":   func(s *corev1.PodSpec) { s.PriorityClassName = "system-node-critical" },
		"with an ephemeral claim of another's volume": func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{
				Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeName: "someone-elses",
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}}}})
		},
		"on a node picked by hostname": func(s *corev1.PodSpec) { s.NodeSelector = map[string]string{"kubernetes.io/hostname": "fake-node-0"} },
		"tolerating control-plane nodes": func(s *corev1.PodSpec) {
			s.Tolerations = []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists}}
		},
		"with a host port": func(s *corev1.PodSpec) { s.Containers[0].Ports[0].HostPort = 22 },
		// SYS_ADMIN is root's on the node when the pod shares its user
		// namespace.
		"with SYS_ADMIN in the node's user namespace": func(s *corev1.PodSpec) {
			s.HostUsers = ptr.To(true)
			s.Containers[0].SecurityContext.Capabilities.Add = append(s.Containers[0].SecurityContext.Capabilities.Add, "SYS_ADMIN")
		},
		"tolerating every taint": func(s *corev1.PodSpec) {
			s.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		},
	} {
		d, err := kube.AppsV1().Deployments(own).Get(ctx, provision.WorkerName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		mutate(&d.Spec.Template.Spec)
		if _, err := kube.AppsV1().Deployments(own).Update(ctx, d, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only as its workers run") {
			t.Errorf("the worker's Deployment %s: %v, want Forbidden by the scope policy", name, err)
		}
	}
	if _, err := p.Deprovision(ctx, tn, "dev"); err != nil {
		t.Fatal(err)
	}
	r.namespaceGone(tn + "-dev")

	// Without the worker's own rights it cannot grant them in a Role.
	var less []rbacv1.PolicyRule
	for _, rule := range provision.ClusterRole().Rules {
		if rule.APIGroups[0] != "batch" {
			less = append(less, rule)
		}
	}
	p2 := r.another(r.serviceAccountWith(t, r.cluster.Namespace(t), provision.ControlPlaneServiceAccount, less))
	var pe *provision.Error
	if _, err := p2.Provision(ctx, r.tenant(), "dev"); !errors.As(err, &pe) || !apierrors.IsForbidden(pe.Err) {
		t.Fatalf("provision without the Jobs rule: %v, want Forbidden", err)
	}
}

// installScopePolicy installs the policy confining the control plane, as
// an administrator does with the ClusterRole, and waits until the API
// server enforces it.
func installScopePolicy(t *testing.T, r *rig) {
	t.Helper()
	ctx := context.Background()
	adm := r.kube.AdmissionregistrationV1()
	for _, f := range []func() (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding){provision.ScopePolicy, provision.JobPolicy} {
		pol, bind := f()
		if _, err := adm.ValidatingAdmissionPolicies().Create(ctx, pol, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if _, err := adm.ValidatingAdmissionPolicyBindings().Create(ctx, bind, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	// A probe ServiceAccount of the control plane's name, allowed to make
	// ConfigMaps anywhere: refused once the policy is in force.
	probeNS := r.cluster.Namespace(t)
	probe := r.serviceAccountWith(t, probeNS, provision.ControlPlaneServiceAccount, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "delete"}}})
	r.waitFor("the scope policy to be enforced", 30*time.Second, func() (bool, error) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}
		_, err := probe.CoreV1().ConfigMaps(probeNS).Create(ctx, cm, metav1.CreateOptions{})
		if err == nil {
			probe.CoreV1().ConfigMaps(probeNS).Delete(ctx, "probe", metav1.DeleteOptions{})
			return false, errors.New("created")
		}
		return apierrors.IsForbidden(err), err
	})
}

// serviceAccountWith makes ServiceAccount ns/name bound cluster-wide to a
// ClusterRole with rules, and returns a client acting as it.
func (r *rig) serviceAccountWith(t *testing.T, ns, name string, rules []rbacv1.PolicyRule) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	admin := r.kube
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crName := ns + "-" + name
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: crName}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: crName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: crName},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), crName, metav1.DeleteOptions{})
		admin.RbacV1().ClusterRoles().Delete(context.Background(), crName, metav1.DeleteOptions{})
	})
	tok, err := r.cluster.Token(ctx, ns, name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(r.cluster.TokenConfig(tok))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// The worker's ServiceAccount, as its pod would use it, can run and watch
// Jobs, read pods and their logs and hold Leases in its namespace, and is
// Forbidden everywhere else, its own Secret included.
func TestWorkerServiceAccountRights(t *testing.T) {
	r := newRig(t, func(c *provision.Config) { c.MaxJobs = 4 })
	ctx := context.Background()
	tn := r.tenant()
	for _, env := range []string{"dev", "prod"} {
		if _, err := r.p.Provision(ctx, tn, env); err != nil {
			t.Fatal(err)
		}
	}
	ns, other := tn+"-dev", tn+"-prod"
	tok, err := r.cluster.Token(ctx, ns, provision.WorkerName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kubernetes.NewForConfig(r.cluster.TokenConfig(tok))
	if err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "build-1"},
		Spec: batchv1.JobSpec{BackoffLimit: ptr.To[int32](0), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "build", Image: "example.invalid/gradle:test"}},
		}}},
	}
	watch, err := w.BatchV1().Jobs(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watch jobs: %v", err)
	}
	defer watch.Stop()
	if _, err := w.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create job: %v", err)
	}
	r.waitFor("the Job to succeed (seen by the watch)", 60*time.Second, func() (bool, error) {
		select {
		case ev := <-watch.ResultChan():
			j, ok := ev.Object.(*batchv1.Job)
			return ok && j.Status.Succeeded == 1, nil
		case <-time.After(time.Second):
			return false, nil
		}
	})
	pods, err := w.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=build-1"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("list pods: %v %v", pods, err)
	}
	if _, err := w.CoreV1().Pods(ns).GetLogs(pods.Items[0].Name, &corev1.PodLogOptions{}).DoRaw(ctx); err != nil {
		t.Fatalf("read pod log: %v", err)
	}
	if err := w.BatchV1().Jobs(ns).Delete(ctx, "build-1", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatalf("delete job: %v", err)
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "talkide-replica-x"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("w1")}}
	got, err := w.CoordinationV1().Leases(ns).Create(ctx, l, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create lease: %v", err)
	}
	got.Spec.HolderIdentity = ptr.To("w2")
	if _, err := w.CoordinationV1().Leases(ns).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("renew lease: %v", err)
	}
	if err := w.CoordinationV1().Leases(ns).Delete(ctx, "talkide-replica-x", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete lease: %v", err)
	}

	// Jobs that would let a compromised worker leave its node are refused
	// (the policy takes a moment to load after it is made).
	evil := map[string]func(*corev1.PodSpec){
		"privileged": func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		},
		"privileged init container": func(s *corev1.PodSpec) {
			s.InitContainers = []corev1.Container{{Name: "i", Image: "x", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}
		},
		"hostPath": func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
		},
		"hostNetwork": func(s *corev1.PodSpec) { s.HostNetwork = true },
		"hostPID":     func(s *corev1.PodSpec) { s.HostPID = true },
		"SYS_ADMIN": func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}
		},
		"unmasked /proc": func(s *corev1.PodSpec) {
			s.HostUsers = ptr.To(false)
			s.Containers[0].SecurityContext = &corev1.SecurityContext{ProcMount: ptr.To(corev1.UnmaskedProcMount)}
		},
		"seccomp unconfined": func(s *corev1.PodSpec) {
			s.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
		},
		"hostPort": func(s *corev1.PodSpec) {
			s.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, HostPort: 80}}
		},
		"AppArmor unconfined": func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext = &corev1.SecurityContext{AppArmorProfile: &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}}
		},
		"SELinux spc_t": func(s *corev1.PodSpec) {
			s.SecurityContext = &corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Type: "spc_t"}}
		},
		"unsafe sysctl": func(s *corev1.PodSpec) {
			s.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "kernel.core_pattern", Value: "|/x"}}}
		},
		"nodeName":      func(s *corev1.PodSpec) { s.NodeName = "fake-node-0" },
		"priorityClass": func(s *corev1.PodSpec) { s.PriorityClassName = "system-node-critical" },
		"tolerate-all":  func(s *corev1.PodSpec) { s.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}} },
		"its own Secret": func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "t", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: provision.SecretName}}}}
		},
		"ephemeral volume": func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{
				Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeName: "someone-elses",
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}}}}}
		},
		"nfs volume": func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "10.0.0.1", Path: "/exports"}}}}
		},
		"ServiceAccount token volume": func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "x", Path: "t"}}}}}}}
		},
		"the worker's ServiceAccount": func(s *corev1.PodSpec) { s.ServiceAccountName = provision.WorkerName },
		"hostname nodeSelector":       func(s *corev1.PodSpec) { s.NodeSelector = map[string]string{"kubernetes.io/hostname": "fake-node-0"} },
		"pod affinity": func(s *corev1.PodSpec) {
			s.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				TopologyKey: "kubernetes.io/hostname", NamespaceSelector: &metav1.LabelSelector{}, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}}}}}
		},
		"runtime class": func(s *corev1.PodSpec) { s.RuntimeClassName = ptr.To("privileged") },
		"node affinity by name": func(s *corev1.PodSpec) {
			s.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"fake-node-0"}}}}}}}}
		},
		"SELinux user": func(s *corev1.PodSpec) {
			s.SecurityContext = &corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{User: "system_u"}}
		},
		"another claim": func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "stolen"}}}}
		},
		"CriticalAddonsOnly": func(s *corev1.PodSpec) {
			s.Tolerations = []corev1.Toleration{{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists}}
		},
		"its own Secret in env": func(s *corev1.PodSpec) {
			s.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: provision.SecretName}}}}
		},
	}
	evilJob := func(name string, mutate func(*corev1.PodSpec)) *batchv1.Job {
		j := job.DeepCopy()
		j.Name = "evil-" + strings.ToLower(strings.NewReplacer(" ", "-", "/", "", "_", "-", "'", "").Replace(name))
		mutate(&j.Spec.Template.Spec)
		return j
	}
	r.waitFor("the Job policy to refuse a privileged Job", 30*time.Second, func() (bool, error) {
		j := evilJob("privileged", evil["privileged"])
		_, err := w.BatchV1().Jobs(ns).Create(ctx, j, metav1.CreateOptions{})
		if err == nil {
			w.BatchV1().Jobs(ns).Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
			return false, errors.New("created")
		}
		return apierrors.IsForbidden(err), err
	})
	for name, mutate := range evil {
		_, err := w.BatchV1().Jobs(ns).Create(ctx, evilJob(name, mutate), metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "a worker's Job") {
			t.Errorf("a %s Job: %v, want Forbidden by the policy", name, err)
		}
	}
	looksLikeWorker := evilJob("looks like the worker", func(*corev1.PodSpec) {})
	looksLikeWorker.Spec.Template.Labels = map[string]string{provision.LabelName: provision.WorkerName}
	fanOut := evilJob("fan out", func(*corev1.PodSpec) {})
	fanOut.Spec.Parallelism, fanOut.Spec.Completions = ptr.To[int32](100000), ptr.To[int32](100000000)
	for _, j := range []*batchv1.Job{looksLikeWorker, fanOut} {
		if _, err := w.BatchV1().Jobs(ns).Create(ctx, j, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "a worker's Job") {
			t.Errorf("Job %s: %v, want Forbidden by the policy", j.Name, err)
		}
	}
	if _, err := w.BatchV1().Jobs(ns).Create(ctx, evilJob("plain again", func(*corev1.PodSpec) {}), metav1.CreateOptions{}); err != nil {
		t.Errorf("a plain Job after the policy: %v", err)
	}
	// The namespace's quota bounds how many Jobs a worker may hold.
	var quotaErr error
	for i := range 2 * r.cfg.MaxJobs {
		if _, quotaErr = w.BatchV1().Jobs(ns).Create(ctx, evilJob(fmt.Sprintf("flood %d", i), func(*corev1.PodSpec) {}), metav1.CreateOptions{}); quotaErr != nil {
			break
		}
	}
	if !apierrors.IsForbidden(quotaErr) || !strings.Contains(quotaErr.Error(), "exceeded quota") {
		t.Errorf("Jobs beyond MaxJobs (%d): %v, want Forbidden by the quota", r.cfg.MaxJobs, quotaErr)
	}

	forbidden := map[string]error{}
	_, forbidden["jobs in another tenant-env"] = w.BatchV1().Jobs(other).List(ctx, metav1.ListOptions{})
	_, forbidden["create job in another tenant-env"] = w.BatchV1().Jobs(other).Create(ctx, job, metav1.CreateOptions{})
	_, forbidden["pods in another tenant-env"] = w.CoreV1().Pods(other).List(ctx, metav1.ListOptions{})
	_, forbidden["leases in another tenant-env"] = w.CoordinationV1().Leases(other).Get(ctx, "x", metav1.GetOptions{})
	_, forbidden["jobs cluster-wide"] = w.BatchV1().Jobs("").List(ctx, metav1.ListOptions{})
	_, forbidden["namespaces"] = w.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	_, forbidden["nodes"] = w.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	_, forbidden["its own Secret"] = w.CoreV1().Secrets(ns).Get(ctx, provision.SecretName, metav1.GetOptions{})
	_, forbidden["secrets of another tenant-env"] = w.CoreV1().Secrets(other).Get(ctx, provision.SecretName, metav1.GetOptions{})
	_, forbidden["its own Role"] = w.RbacV1().Roles(ns).Update(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: provision.WorkerName}}, metav1.UpdateOptions{})
	_, forbidden["create pods"] = w.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: job.Spec.Template.Spec}, metav1.CreateOptions{})
	for what, err := range forbidden {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", what, err)
		}
	}
}
