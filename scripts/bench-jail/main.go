// Command bench-jail measures what agent containment adds to starting an
// agent process: /bin/true started plainly as an agent uid (the baseline)
// and in a sandbox.Jail (bubblewrap namespaces and a control group),
// alternating, in the same run. It needs root and bwrap, like the worker.
//
// It prints the percentiles of each and ends with one line:
//
//	bench-jail n=50 plain_p50_ms=4.1 jail_p50_ms=21.0 added_p50_ms=16.9 added_p99_ms=30.2 ratio_p50=5.12
//
// A CLI process starts once per active conversation (not per turn), and the
// CLI's own start takes about a second, which is what the added time is
// to be read against.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"syscall"
	"time"

	"github.com/talkide/talkide/internal/worker/sandbox"
)

func main() {
	n := flag.Int("n", 50, "starts of each kind")
	flag.Parse()
	if err := run(*n); err != nil {
		fmt.Fprintln(os.Stderr, "bench-jail:", err)
		os.Exit(1)
	}
}

func run(n int) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("run as root (the worker jails agents of their own uid as root)")
	}
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		return fmt.Errorf("bwrap: %w (make tools installs it)", err)
	}
	cg, err := sandbox.OpenCgroups(fmt.Sprintf("bench-jail-%d", os.Getpid()))
	if err != nil {
		return err
	}
	defer cg.Close()
	u := &sandbox.User{UID: 299992, GID: 299992}
	dir, err := os.MkdirTemp("", "talkide-bench-jail-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.Chown(dir, int(u.UID), int(u.GID)); err != nil {
		return err
	}
	j := &sandbox.Jail{Bwrap: bwrap, Cgroups: cg, Limits: sandbox.DefaultLimits}
	plain := func() error {
		cmd := exec.Command("/bin/true")
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: u.Credential(), Setpgid: true}
		return cmd.Run()
	}
	jailed := func() error {
		c, err := j.Command(sandbox.Spec{Name: "bench", User: u, Path: "/bin/true", Dir: dir, Writable: []string{dir}})
		if err != nil {
			return err
		}
		if err := c.Start(); err != nil {
			return err
		}
		err = c.Cmd.Wait()
		c.Close()
		return err
	}
	var ps, js []time.Duration
	for i := 0; i < n+2; i++ {
		for _, k := range []struct {
			f   func() error
			out *[]time.Duration
		}{{plain, &ps}, {jailed, &js}} {
			t0 := time.Now()
			if err := k.f(); err != nil {
				return err
			}
			if i >= 2 { // two warm-up rounds
				*k.out = append(*k.out, time.Since(t0))
			}
		}
	}
	pp50, pp99 := pct(ps, 50), pct(ps, 99)
	jp50, jp99 := pct(js, 50), pct(js, 99)
	fmt.Printf("# bench-jail: /bin/true as uid %d, %d starts of each, alternating, after 2 warm-up rounds; cgroup v%d\n", u.UID, n, cg.Version())
	fmt.Printf("%-6s %10s %10s\n", "kind", "p50_ms", "p99_ms")
	fmt.Printf("%-6s %10.2f %10.2f\n", "plain", ms(pp50), ms(pp99))
	fmt.Printf("%-6s %10.2f %10.2f\n", "jail", ms(jp50), ms(jp99))
	fmt.Printf("bench-jail n=%d plain_p50_ms=%.2f jail_p50_ms=%.2f added_p50_ms=%.2f added_p99_ms=%.2f ratio_p50=%.2f\n",
		n, ms(pp50), ms(jp50), ms(jp50-pp50), ms(jp99-pp99), float64(jp50)/float64(pp50))
	return nil
}

func pct(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)-1)*p/100]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
