package provision

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// satisfies takes the API server's defaults and others' additions as no
// difference, and any changed or removed value the provisioner sets as
// one.
func TestSatisfies(t *testing.T) {
	c := &Config{Installation: "i", Replicas: 1, Image: "img"}
	want := deploymentObject(c, "t", "e", "h")
	same := want.DeepCopy()
	// What the API server adds, and what others add.
	same.UID, same.ResourceVersion, same.Generation = "u", "7", 3
	same.Labels["someone"] = "else"
	same.Spec.RevisionHistoryLimit = ptr.To[int32](10)
	pod := &same.Spec.Template.Spec
	pod.RestartPolicy, pod.DNSPolicy = corev1.RestartPolicyAlways, corev1.DNSClusterFirst
	pod.Containers[0].TerminationMessagePath = "/dev/termination-log"
	pod.Containers[0].ReadinessProbe.SuccessThreshold = 1
	pod.Containers[0].ReadinessProbe.HTTPGet.Scheme = corev1.URISchemeHTTP
	same.Status.ReadyReplicas = 1
	if !satisfies(want, same) {
		t.Fatal("a Deployment with only defaults and others' additions counts as different")
	}
	for name, change := range map[string]func(d *corev1.PodSpec, labels map[string]string, replicas **int32){
		"scaled":          func(_ *corev1.PodSpec, _ map[string]string, r **int32) { *r = ptr.To[int32](0) },
		"image changed":   func(p *corev1.PodSpec, _ map[string]string, _ **int32) { p.Containers[0].Image = "other" },
		"env var removed": func(p *corev1.PodSpec, _ map[string]string, _ **int32) { p.Containers[0].Env = p.Containers[0].Env[1:] },
		"label changed":   func(_ *corev1.PodSpec, l map[string]string, _ **int32) { l[LabelTenant] = "x" },
		"label removed":   func(_ *corev1.PodSpec, l map[string]string, _ **int32) { delete(l, LabelInstallation) },
		"capability added": func(p *corev1.PodSpec, _ map[string]string, _ **int32) {
			p.Containers[0].SecurityContext.Capabilities.Add = append(p.Containers[0].SecurityContext.Capabilities.Add, "SYS_ADMIN")
		},
		"privilege allowed": func(p *corev1.PodSpec, _ map[string]string, _ **int32) {
			p.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
		},
	} {
		live := same.DeepCopy()
		change(&live.Spec.Template.Spec, live.Labels, &live.Spec.Replicas)
		if satisfies(want, live) {
			t.Errorf("%s: counts as the same", name)
		}
	}

	// A key added to a selector, which apply replaces whole: the jobs'
	// NetworkPolicy would select no pod (and so confine none).
	np := jobsNetworkPolicyObject(c, "t", "e")
	live := np.DeepCopy()
	if !satisfies(np, live) {
		t.Fatal("an unchanged NetworkPolicy counts as different")
	}
	live.Spec.PodSelector.MatchLabels = map[string]string{"x": "y"}
	if satisfies(np, live) {
		t.Error("a NetworkPolicy whose pod selector gained a key counts as the same")
	}
	svc := serviceObject(c, "t", "e")
	liveSvc := svc.DeepCopy()
	liveSvc.Spec.Selector["x"] = "y"
	if satisfies(svc, liveSvc) {
		t.Error("a Service whose selector gained a key counts as the same")
	}
	liveDep := same.DeepCopy()
	liveDep.Spec.Template.Spec.NodeSelector = map[string]string{"x": "y"}
	if want.Spec.Template.Spec.NodeSelector == nil {
		// No node selector configured: one added by others is theirs.
		if !satisfies(want, liveDep) {
			t.Error("a node selector added where none is configured counts as different")
		}
	}
}

// Updates that change only what the cluster reports queue nothing; any
// change to what the provisioner writes does.
func TestStatusOnly(t *testing.T) {
	c := &Config{Installation: "i", Replicas: 1, Image: "img"}
	dep := deploymentObject(c, "t", "e", "h")
	ready := dep.DeepCopy()
	ready.Status.ReadyReplicas, ready.Status.AvailableReplicas = 1, 1
	if !statusOnly(dep, ready) {
		t.Error("a Deployment turning ready queues a reconcile")
	}
	scaled := dep.DeepCopy()
	scaled.Spec.Replicas = ptr.To[int32](0)
	relabelled := dep.DeepCopy()
	relabelled.Labels[LabelTenant] = "x"
	svc := serviceObject(c, "t", "e")
	for name, pair := range map[string][2]any{
		"a Deployment scaled":        {dep, scaled},
		"a Deployment relabelled":    {dep, relabelled},
		"a Service (no status kind)": {svc, svc.DeepCopy()},
	} {
		if statusOnly(pair[0], pair[1]) {
			t.Errorf("%s: queues nothing", name)
		}
	}
}
