package controlstore

import (
	"fmt"
	"net"
	"strings"
	"testing"
)

// TestOpenPostgresErrorHidesEveryPassword guards against a start-up error
// that prints the database password: the control plane reports
// OpenPostgres's error as it is, so no form of password may be in it.
func TestOpenPostgresErrorHidesEveryPassword(t *testing.T) {
	// A port nothing listens on: connecting fails at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	const secret = "S3cret"
	for _, dsn := range []string{
		fmt.Sprintf("postgres://bob:%s@127.0.0.1:%d/db?sslmode=disable", secret, port),
		fmt.Sprintf("postgres://bob@127.0.0.1:%d/db?sslmode=disable&password=%s", port, secret),
		fmt.Sprintf("postgresql://bob@127.0.0.1:%d/db?sslmode=disable&pass%%77ord=%s", port, secret),
		fmt.Sprintf("postgres://bob@127.0.0.1:%d/db?sslmode=disable&sslpassword=%s", port, secret),
		fmt.Sprintf("host=127.0.0.1 port=%d user=bob password=%s sslmode=disable", port, secret),
		fmt.Sprintf("host=127.0.0.1 port=%d user=bob password='%s and more' sslmode=disable", port, secret),
		// What pgx cannot parse: it quotes the string back in its error.
		fmt.Sprintf("postgres://bob@127.0.0.1:%d/db?sslmode=disable&password=%s&bad", port, secret),
		fmt.Sprintf("host=127.0.0.1 port=notaport password=%s", secret),
	} {
		db, err := OpenPostgres(t.Context(), dsn, 1)
		if err == nil {
			db.Close()
			t.Errorf("OpenPostgres(%q) connected to a closed port", dsn)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("OpenPostgres(%q) error: %v\nwant no password in it", dsn, err)
		}
		if !strings.Contains(err.Error(), "postgres") {
			t.Errorf("OpenPostgres(%q) error: %v\nwant it to say what it opened", dsn, err)
		}
	}
}
