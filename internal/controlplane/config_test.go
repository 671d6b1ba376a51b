package controlplane

import (
	"testing"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
)

func TestParseTenantEnvs(t *testing.T) {
	got, err := controlstore.ParseTenantEnvs(" demo/dev, acme-co/prod ,")
	if err != nil || len(got) != 2 || got[1] != [2]string{"acme-co", "prod"} {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"demo", "demo/", "/dev", "Demo/dev", "de mo/dev", "-a/dev", "a/b/c", "../x/dev"} {
		if _, err := controlstore.ParseTenantEnvs(bad); err == nil {
			t.Errorf("controlstore.ParseTenantEnvs(%q): got nil error", bad)
		}
	}
}

func FuzzParseTenantEnvs(f *testing.F) {
	f.Add("demo/dev,acme/prod")
	f.Fuzz(func(t *testing.T, s string) {
		tes, err := controlstore.ParseTenantEnvs(s)
		if err != nil {
			return
		}
		for _, te := range tes {
			if !validName(te[0]) || !validName(te[1]) {
				t.Fatalf("accepted %q", te)
			}
		}
	})
}
