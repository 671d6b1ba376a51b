package pgtest

import (
	"strings"
	"testing"
)

// TestStringHidesThePassword guards against the test server's password
// reaching test logs, in the URL's userinfo or in its query.
func TestStringHidesThePassword(t *testing.T) {
	for _, u := range []string{
		"postgres://postgres:S3cret@127.0.0.1:5432/test?sslmode=disable",
		"postgres://postgres@127.0.0.1:5432/test?sslmode=disable&password=S3cret",
	} {
		t.Setenv("TALKIDE_TEST_POSTGRES_URL", u)
		if got := String(); strings.Contains(got, "S3cret") || !strings.Contains(got, "127.0.0.1:5432") {
			t.Errorf("String() with server %q = %q, want the host and no password", u, got)
		}
	}
}
