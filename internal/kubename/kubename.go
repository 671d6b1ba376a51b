// Package kubename holds the names both sides give a tenant-env's
// Kubernetes objects: the namespace "{tenant}-{env}", the labels on every
// object, the session volume's claim, and the checks on tenant and env names
// and on pinned images. The control plane's provisioner makes the objects
// with these names; the worker's build Jobs find the volume and carry the
// labels.
//
// It is its own package so that the worker can use the names without
// linking the provisioner (package provision), which holds the control
// plane's database and master key. It makes no objects and calls no API
// server.
package kubename

import (
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Labels on the objects of a tenant-env.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelPartOf    = "app.kubernetes.io/part-of"
	PartOf         = "talkide"
	LabelTenant    = "talkide.dev/tenant"
	LabelEnv       = "talkide.dev/env"
)

// PVCName is the claim of a tenant-env's session volume (CLAUDE_CONFIG_DIR
// and the conversations' working trees).
const PVCName = "claude-sessions"

// Namespace is the namespace of a tenant-env's worker.
func Namespace(tenant, env string) string { return tenant + "-" + env }

// ValidName reports whether s may be a tenant or env name: a DNS label of
// at most 30 characters, so that "{tenant}-{env}" is a namespace name.
func ValidName(s string) bool {
	if s == "" || len(s) > 30 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

var digestPinned = regexp.MustCompile(`^[a-z0-9][-a-z0-9._/:]*@sha256:[0-9a-f]{64}$`)

// DigestPinned reports whether image is a reference pinned by digest,
// repository@sha256:<64 hex digits>, as a build Job's image must be: a
// tag can change under a running platform.
func DigestPinned(image string) bool { return digestPinned.MatchString(image) }

// ParseTolerations reads "key=value:Effect,key:Effect" (Equal with a
// value, Exists without); an empty effect tolerates every effect of the
// taint.
func ParseTolerations(s string) ([]corev1.Toleration, error) {
	var out []corev1.Toleration
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		kv, effect, _ := strings.Cut(item, ":")
		t := corev1.Toleration{Effect: corev1.TaintEffect(effect), Operator: corev1.TolerationOpExists}
		key, value, hasValue := strings.Cut(kv, "=")
		t.Key = key
		if hasValue {
			t.Operator, t.Value = corev1.TolerationOpEqual, value
		}
		switch t.Effect {
		case "", corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			return nil, fmt.Errorf("toleration %q: effect must be NoSchedule, PreferNoSchedule or NoExecute", item)
		}
		out = append(out, t)
	}
	return out, nil
}

// ParseSelector reads "key=value,key=value".
func ParseSelector(s string) (map[string]string, error) {
	out := map[string]string{}
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("node selector %q: want key=value", item)
		}
		out[k] = v
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}
