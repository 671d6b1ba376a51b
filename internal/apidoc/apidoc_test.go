package apidoc

import "testing"

// TestDocumentsLoad: both references parse, each with an error table and
// endpoint sections with Errors paragraphs.
func TestDocumentsLoad(t *testing.T) {
	for _, name := range []string{"docs/browser-api.md", "docs/worker-api.md"} {
		d, err := Load(name)
		if err != nil {
			t.Fatal(err)
		}
		withErrors := 0
		for _, e := range d.Endpoints {
			if e.Line != 0 {
				withErrors++
			}
		}
		if len(d.Types) < 10 || withErrors < 5 {
			t.Errorf("%s: %d error types, %d endpoints with an Errors paragraph; the parser no longer understands the document", name, len(d.Types), withErrors)
		}
		for k, e := range d.Endpoints {
			t.Logf("%s %s §%s line %d: %v", name, k, e.Section, e.Line, e.Errors)
		}
		for k, r := range d.Types {
			t.Logf("%s type %s %d unused=%v", name, k, r.Status, r.Unused)
		}
	}
}
