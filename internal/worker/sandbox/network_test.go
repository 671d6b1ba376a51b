package sandbox

import (
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// A jail with a network of its own reaches the listener the worker serves
// inside it, and nothing of the host: not a service on the host's
// loopback, not the host's sockets in /proc/net.
func TestJailPrivateNetwork(t *testing.T) {
	j, u, dir := testJail(t, Limits{})
	helper, err := InstallHelper(filepath.Join(filepath.Dir(dir), "helper"))
	if err != nil {
		t.Fatal(err)
	}
	j.Helper = helper
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	go http.Serve(host, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "host-service-reached") }))
	secret, err := net.Listen("unix", "@talkide-test-secret-"+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer secret.Close()
	hostPort := host.Addr().(*net.TCPAddr).Port
	for _, shared := range []bool{false, true} {
		j.SharedProc = shared
		script := fmt.Sprintf(`
exec 3<>/dev/tcp/127.0.0.1/45123 && printf 'GET /c1/x HTTP/1.0\r\n\r\n' >&3 && cat <&3
(exec 4<>/dev/tcp/127.0.0.1/%d && printf 'GET / HTTP/1.0\r\n\r\n' >&4 && cat <&4) 2>/dev/null || echo host-loopback-refused
grep -c talkide-test-secret /proc/net/unix | sed 's/^/host-sockets-seen: /'
ip -o addr 2>/dev/null | awk '{print "iface " $2}'
`, hostPort)
		c, err := j.Command(Spec{Name: "net", User: u, Path: "/bin/bash", Args: []string{"-c", script}, Env: []string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin"},
			Dir: dir, Writable: []string{dir}, PrivateNetwork: true, Listen: "127.0.0.1:45123"})
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		c.Cmd.Stdout, c.Cmd.Stderr = &out, &out
		if err := c.Start(); err != nil {
			t.Fatalf("%v: %s", err, out.String())
		}
		ln := c.Listener()
		if ln == nil {
			t.Fatal("no listener")
		}
		go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "worker-served "+r.URL.Path) }))
		c.Cmd.Wait()
		c.Close()
		ln.Close()
		got := out.String()
		for _, want := range []string{"worker-served /c1/x", "host-loopback-refused", "host-sockets-seen: 0"} {
			if !strings.Contains(got, want) {
				t.Errorf("shared proc %v: want %q in\n%s", shared, want, got)
			}
		}
		if strings.Contains(got, "host-service-reached") || strings.Contains(got, "eth") {
			t.Errorf("shared proc %v: the host's network is reachable:\n%s", shared, got)
		}
	}
}
