package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/talkide/talkide/internal/contract"
)

type idleSample struct {
	cpuPct float64
	stats  procStats
}

type idleResult struct {
	conversations    int
	before, after    idleSample
	createRate       float64
	coldP50, coldP99 time.Duration
	warmP50, warmP99 time.Duration
	coldN            int
}

// benchIdle creates o.conversations conversations on a worker (none with a
// CLI) and measures the worker idle before and after, and cold loads.
func benchIdle(o options, standin string) (idleResult, error) {
	r := idleResult{conversations: o.conversations}
	dir, err := os.MkdirTemp(o.volume, "talkide-bench-worker-idle-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o711); err != nil {
		return r, err
	}
	cc := childConfig{ClaudeBin: standin, Containment: "strict", MaxProcesses: 4, AgentUser: o.idleAgentUser,
		MaxConversations: max(o.conversations+100, 1000), UIDCount: uint32(max(100000, 2*o.conversations))}
	if o.pprofDir != "" {
		cc.PprofAddr = "127.0.0.1:6061"
	}
	p, err := startPlatform(dir, filepath.Join(dir, "sessions"), cc)
	if err != nil {
		return r, err
	}
	defer p.close()
	pid := p.w.pid()
	fmt.Printf("# idle: worker pid %d, session volume %s, agent user %s; no CLI runs in this phase\n", pid, dir, o.idleAgentUser)

	time.Sleep(2 * time.Second) // start-up settles
	cpu, st, err := idleUsage(pid, o.idle)
	if err != nil {
		return r, err
	}
	r.before = idleSample{cpu, st}
	fmt.Printf("# idle, no conversations: cpu %.2f%% of a core over %s, rss %.1f MB, open files %d\n", cpu, o.idle, mb(st.RSS), st.Files)

	// Create the conversations through the worker's API, as the control
	// plane does (signed request tokens), o.createC at a time.
	ctx := context.Background()
	var createProf func() error
	if o.pprofDir != "" {
		createProf = profile("http://"+cc.PprofAddr, filepath.Join(o.pprofDir, "worker-create.pprof"), 10*time.Second)
	}
	t0 := time.Now()
	var next, done atomic.Int64
	var firstErr error
	var errMu sync.Mutex
	var wg sync.WaitGroup
	for range o.createC {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(o.conversations) {
					return
				}
				if _, err := p.wc.CreateSession(ctx, convID(int(i)), contract.CreateSessionRequest{UserID: "bench-user"}); err != nil {
					errMu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("create %s: %w", convID(int(i)), err)
					}
					errMu.Unlock()
					next.Store(int64(o.conversations))
					return
				}
				if n := done.Add(1); n%max(int64(o.conversations)/10, 1) == 0 {
					fmt.Printf("#   created %d (%.0f/s)\n", n, float64(n)/time.Since(t0).Seconds())
				}
			}
		})
	}
	wg.Wait()
	if createProf != nil {
		if err := createProf(); err != nil {
			fmt.Printf("# pprof: %v\n", err)
		}
	}
	if firstErr != nil {
		return r, firstErr
	}
	r.createRate = float64(o.conversations) / time.Since(t0).Seconds()
	fmt.Printf("# created %d conversations in %s (%.0f/s, %d at a time, through the worker's API)\n", o.conversations, time.Since(t0).Round(time.Second), r.createRate, o.createC)

	time.Sleep(2 * time.Second)
	var prof func() error
	if o.pprofDir != "" {
		prof = profile("http://"+cc.PprofAddr, filepath.Join(o.pprofDir, "worker-idle.pprof"), o.idle-time.Second)
	}
	cpu, st, err = idleUsage(pid, o.idle)
	if err != nil {
		return r, err
	}
	if prof != nil {
		if err := prof(); err != nil {
			fmt.Printf("# pprof: %v\n", err)
		}
	}
	r.after = idleSample{cpu, st}
	fmt.Printf("# idle, %d conversations: cpu %.2f%% of a core over %s, rss %.1f MB, open files %d\n", o.conversations, cpu, o.idle, mb(st.RSS), st.Files)

	// A warm conversation: kept loaded by an open event stream.
	warm := convID(0)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	es, err := p.wc.Events(sctx, warm, 0)
	if err != nil {
		return r, err
	}
	defer es.Close()
	// Cold ones: spread over the whole set, each loaded once.
	n := min(o.cold, o.conversations-1)
	var cold, warmD []time.Duration
	for i := range n {
		id := convID(1 + i*(o.conversations-1)/max(n, 1))
		t := time.Now()
		if _, err := p.wc.Status(ctx, id); err != nil {
			return r, fmt.Errorf("status %s: %w", id, err)
		}
		cold = append(cold, time.Since(t))
		t = time.Now()
		if _, err := p.wc.Status(ctx, warm); err != nil {
			return r, fmt.Errorf("status %s: %w", warm, err)
		}
		warmD = append(warmD, time.Since(t))
	}
	r.coldN = n
	r.coldP50, r.coldP99 = pct(cold, 50), pct(cold, 99)
	r.warmP50, r.warmP99 = pct(warmD, 50), pct(warmD, 99)
	fmt.Printf("# status request (GET, signed), %d of each alternating: cold (loads the conversation, then unloads it) p50 %.2f ms p99 %.2f ms; warm (loaded: an event stream follows it) p50 %.2f ms p99 %.2f ms; added by the load p50 %.2f ms\n",
		n, ms(r.coldP50), ms(r.coldP99), ms(r.warmP50), ms(r.warmP99), ms(r.coldP50-r.warmP50))
	fmt.Printf("%-28s %10s %10s %10s\n", "idle worker", "cpu_pct", "rss_mb", "open_files")
	fmt.Printf("%-28s %10.2f %10.1f %10d\n", "no conversations", r.before.cpuPct, mb(r.before.stats.RSS), r.before.stats.Files)
	fmt.Printf("%-28s %10.2f %10.1f %10d\n", fmt.Sprintf("%d conversations", o.conversations), r.after.cpuPct, mb(r.after.stats.RSS), r.after.stats.Files)
	return r, nil
}

func convID(i int) string { return fmt.Sprintf("bench-%07d", i) }

// profile starts fetching a CPU profile of d from a pprof server; the
// returned func waits for it and writes it to path.
func profile(base, path string, d time.Duration) func() error {
	errc := make(chan error, 1)
	go func() {
		resp, err := http.Get(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, int(d.Seconds())))
		if err != nil {
			errc <- err
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(path)
		if err != nil {
			errc <- err
			return
		}
		_, err = io.Copy(f, resp.Body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		errc <- err
	}()
	return func() error { return <-errc }
}
