package provision

import (
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
)

// satisfies reports whether live already has every field desired sets,
// with the same value: desired's labels, annotations and spec (or rules,
// subjects, role reference) compared as JSON trees, where a map of
// desired must be contained in live's, a list must have as many elements
// each satisfied in order, and a value desired leaves unset (omitted or
// null) is not compared, but a field apply replaces whole (atomic) must be
// equal. So the API server's defaults and fields others added do not count
// as a difference, and a changed or removed value does.
// Any conversion error counts as a difference (the object is applied).
func satisfies(desired, live runtime.Object) bool {
	d, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return false
	}
	l, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
	if err != nil {
		return false
	}
	delete(d, "apiVersion")
	delete(d, "kind")
	delete(d, "status")
	if m, ok := d["metadata"].(map[string]any); ok {
		d["metadata"] = map[string]any{"labels": m["labels"], "annotations": m["annotations"]}
	}
	return contains(d, l)
}

// atomic are the fields that server-side apply replaces whole (label
// selectors, Service and node selectors): a key someone added to one is a
// difference (it can make a NetworkPolicy select no pod at all), and
// applying the object removes it.
var atomic = map[string]bool{"selector": true, "matchLabels": true, "podSelector": true, "namespaceSelector": true, "nodeSelector": true}

// contains reports whether live has every value of desired (see
// satisfies).
func contains(desired, live any) bool {
	switch d := desired.(type) {
	case nil:
		return true
	case map[string]any:
		l, ok := live.(map[string]any)
		if !ok {
			return len(d) == 0 && live == nil
		}
		for k, v := range d {
			if atomic[k] && v != nil {
				if !equality.Semantic.DeepEqual(v, l[k]) {
					return false
				}
				continue
			}
			if !contains(v, l[k]) {
				return false
			}
		}
		return true
	case []any:
		l, ok := live.([]any)
		if !ok {
			return len(d) == 0 && live == nil
		}
		if len(d) != len(l) {
			return false
		}
		for i := range d {
			if !contains(d[i], l[i]) {
				return false
			}
		}
		return true
	default:
		return equality.Semantic.DeepEqual(desired, live)
	}
}
