// Command bench-worker measures the worker at scale, each figure against a
// baseline measured in the same run (docs/benchmarks.md, "bench-worker"):
//
//   - idle: a worker process with -conversations conversations created
//     through its HTTP API and no CLI running: its CPU over -idle of
//     idleness (share of one core), RSS and open files, against the same
//     worker with none; and the time a request takes to load a cold
//     conversation, against a request to a loaded one.
//   - active: -active conversations running turns at once with a stand-in
//     for the CLI (./standin): latency from the stand-in's stdout write to
//     the event's arrival on the browser stream, and events per second,
//     against the same stand-ins read directly through pipes.
//   - turns: the real pinned CLI through the whole platform against the
//     same CLI driven directly over stream-json, on the same development
//     upstream, turn by turn (a Bash command and an answer quoting it).
//
// It ends with one line:
//
//	bench-worker conversations=100000 idle_cpu_pct=… rss_mb=… open_files=… cold_load_ms=… active=200 event_p50_ms=… event_p99_ms=… worker_cpu_us_per_event=… turn_overhead_ratio=…
//
// It runs as root like the worker (agents of their own uids, jails).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

type options struct {
	conversations, createC, cold int
	idle                         time.Duration
	active, lines, rounds        int
	gap                          time.Duration
	turns, warmup                int
	dir, volume, containment     string
	pprofDir, idleAgentUser      string
	phases                       string
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func main() {
	if os.Getenv(envChild) != "" {
		childMain()
		return
	}
	var o options
	flag.IntVar(&o.conversations, "conversations", 100000, "idle: conversations to create")
	flag.IntVar(&o.createC, "create-concurrency", 8, "idle: concurrent creates")
	flag.DurationVar(&o.idle, "idle", 60*time.Second, "idle: how long CPU is measured, with and without the conversations")
	flag.IntVar(&o.cold, "cold", 200, "idle: cold and warm requests timed")
	flag.StringVar(&o.volume, "volume", defaultVolume(), "idle: where the session volume of the idle worker goes (creating is fsync-bound on a disk)")
	flag.StringVar(&o.idleAgentUser, "idle-agent-user", "299999:299999", "idle: TALKIDE_AGENT_USER of the idle worker; per-conversation claims a uid per create, scanning /proc each time (slow: see README)")
	flag.IntVar(&o.active, "active", 200, "active: conversations running turns at once")
	flag.IntVar(&o.lines, "lines", 10, "active: assistant text lines per stand-in turn")
	flag.DurationVar(&o.gap, "gap", 100*time.Millisecond, "active: time between a stand-in's lines")
	flag.IntVar(&o.rounds, "rounds", 3, "active: measured turns per conversation (after one warm-up turn)")
	flag.IntVar(&o.turns, "turns", 10, "turns: measured turns of each kind (direct, platform), alternating")
	flag.IntVar(&o.warmup, "warmup", 2, "turns: warm-up turns of each kind")
	flag.StringVar(&o.dir, "dir", os.TempDir(), "where the active and turns phases keep their state (a disk, as a session volume)")
	flag.StringVar(&o.containment, "containment", "strict", "containment of the stand-in agents (strict or weak)")
	flag.StringVar(&o.pprofDir, "pprof", "", "write CPU profiles of the worker (idle with the conversations, active) into this directory")
	flag.StringVar(&o.phases, "phases", "idle,active,turns", "phases to run")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-worker:", err)
		os.Exit(1)
	}
}

func defaultVolume() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

func run(o options) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("run as root (the worker gives each agent a uid of its own and a jail as root)")
	}
	start := time.Now()
	phases := strings.Split(o.phases, ",")
	work, err := os.MkdirTemp(o.dir, "talkide-bench-worker-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := os.Chmod(work, 0o711); err != nil {
		return err
	}
	standin, err := buildStandin(work)
	if err != nil {
		return err
	}
	fmt.Printf("# bench-worker: %d CPUs (GOMAXPROCS %d), %s, %s/%s\n", runtime.NumCPU(), runtime.GOMAXPROCS(0), cpuModel(), runtime.GOOS, runtime.GOARCH)
	var (
		ir idleResult
		ar activeResult
		tr turnsResult
	)
	if slices.Contains(phases, "idle") {
		if ir, err = benchIdle(o, standin); err != nil {
			return fmt.Errorf("idle: %w", err)
		}
	}
	if slices.Contains(phases, "active") {
		if ar, err = benchActive(o, work, standin); err != nil {
			return fmt.Errorf("active: %w", err)
		}
	}
	if slices.Contains(phases, "turns") {
		if tr, err = benchTurns(o, work); err != nil {
			return fmt.Errorf("turns: %w", err)
		}
	}
	fmt.Printf("# took %s\n", time.Since(start).Round(time.Second))
	fmt.Printf("bench-worker conversations=%d idle_cpu_pct=%.2f rss_mb=%.1f open_files=%d cold_load_ms=%.2f active=%d event_p50_ms=%.2f event_p99_ms=%.2f worker_cpu_us_per_event=%.0f turn_overhead_ratio=%.2f\n",
		ir.conversations, ir.after.cpuPct, mb(ir.after.stats.RSS), ir.after.stats.Files, ms(ir.coldP50),
		ar.active, ms(ar.platform.p50), ms(ar.platform.p99), cpuPerEvent(ar.workerCPU, ar.platform), tr.ratio)
	return nil
}

// buildStandin compiles ./standin into dir.
func buildStandin(dir string) (string, error) {
	bin := filepath.Join(dir, "standin")
	src, err := filepath.Abs(filepath.Join(sourceDir(), "standin"))
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = src
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build the stand-in: %w", err)
	}
	return bin, nil
}

// sourceDir is scripts/bench-worker (go run runs from the module root).
func sourceDir() string {
	if _, err := os.Stat("scripts/bench-worker/standin"); err == nil {
		return "scripts/bench-worker"
	}
	return "."
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return "unknown CPU"
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func mb(b int64) float64         { return float64(b) / (1 << 20) }
