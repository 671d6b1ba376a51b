package pgdsn

import (
	"strings"
	"testing"
)

// The secret in every case below; none may survive Redact.
const secret = "S3cret"

var redactCases = []struct {
	name, dsn, want string
}{
	{"URL userinfo", "postgres://bob:S3cret@db.example:5432/app?sslmode=disable",
		"postgres://bob:xxxxx@db.example:5432/app?sslmode=disable"},
	{"URL query password (the reviewer's case)", "postgres://bob@host/db?sslmode=disable&password=S3cret",
		"postgres://bob@host/db?sslmode=disable&password=xxxxx"},
	{"URL query password first", "postgresql://host/db?password=S3cret&sslmode=require",
		"postgresql://host/db?password=xxxxx&sslmode=require"},
	{"URL query sslpassword", "postgres://bob@host/db?sslkey=/k.pem&sslpassword=S3cret",
		"postgres://bob@host/db?sslkey=/k.pem&sslpassword=xxxxx"},
	{"URL percent-encoded key", "postgres://bob@host/db?pass%77ord=S3cret",
		"postgres://bob@host/db?pass%77ord=xxxxx"},
	{"URL percent-encoded password", "postgres://bob@host/db?password=S3%63ret",
		"postgres://bob@host/db?password=xxxxx"},
	{"URL both", "postgres://bob:S3cret@host/db?password=S3cret",
		"postgres://bob:xxxxx@host/db?password=xxxxx"},
	{"URL no password", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
		"postgres://postgres@127.0.0.1:5432/test?sslmode=disable"},
	{"URL unparsable", "postgres://bob:S3cret@host:port%zz/db", "(unparsable postgres URL)"},
	{"keyword/value", "host=db.example user=bob password=S3cret dbname=app",
		"host=db.example user=bob password=xxxxx dbname=app"},
	{"keyword/value quoted", "host=x password='S3cret with spaces' sslmode=disable",
		"host=x password=xxxxx sslmode=disable"},
	{"keyword/value quoted with an escaped quote", `host=x password='S3cret\' dbname=y' user=z`,
		"host=x password=xxxxx user=z"},
	{"keyword/value spaces around =", "host = x password = S3cret",
		"host = x password = xxxxx"},
	{"keyword/value escaped space", `password=S3cret\ more host=x`, "password=xxxxx host=x"},
	{"keyword/value sslpassword", "host=x sslpassword=S3cret", "host=x sslpassword=xxxxx"},
	{"keyword/value unterminated quote", "host=x password='S3cret", "(unparsable postgres connection string)"},
	{"keyword/value no password", "host=x dbname=y", "host=x dbname=y"},
}

func TestRedactMasksEveryPasswordForm(t *testing.T) {
	for _, c := range redactCases {
		got := Redact(c.dsn)
		if got != c.want {
			t.Errorf("%s: Redact(%q) = %q, want %q", c.name, c.dsn, got, c.want)
		}
		if strings.Contains(got, secret) || strings.Contains(got, "S3%63ret") {
			t.Errorf("%s: Redact(%q) = %q still holds the password", c.name, c.dsn, got)
		}
	}
}

func TestScrubRemovesPasswordsFromText(t *testing.T) {
	for _, c := range redactCases {
		if strings.HasPrefix(c.want, "(unparsable") || !strings.Contains(c.dsn, "S3") {
			continue
		}
		text := "cannot parse `" + c.dsn + "`: invalid port"
		if got := Scrub(text, c.dsn); strings.Contains(got, secret) {
			t.Errorf("%s: Scrub(…, %q) = %q, want no password in it", c.name, c.dsn, got)
		}
	}
	if got := Scrub("connect: refused", "postgres://bob@host/db"); got != "connect: refused" {
		t.Errorf("Scrub with no password changed the text to %q", got)
	}
}

// A raw '@' in the user information is refused, without the URL in the
// error; percent-encoded, or in the query, it is fine.
func TestCheckURLRefusesARawAt(t *testing.T) {
	for _, bad := range []string{"postgres://u:SEC@RETPW@127.0.0.1:1/db", "postgresql://u@x:p@h/db"} {
		err := CheckURL(bad)
		if err == nil || strings.Contains(err.Error(), "SEC") || strings.Contains(err.Error(), "RETPW") {
			t.Errorf("CheckURL: %v", err)
		}
	}
	for _, ok := range []string{"postgres://u:SEC%40RETPW@127.0.0.1:1/db", "postgres://u@h/db?application_name=a@b", "postgres://h/db"} {
		if err := CheckURL(ok); err != nil {
			t.Errorf("CheckURL(%q): %v", ok, err)
		}
	}
}
