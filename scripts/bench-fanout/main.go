// Command bench-fanout measures the browser event streams of control-plane
// processes (docs/benchmarks.md, "bench-fanout"), each figure against a
// baseline measured in the same run:
//
//   - capacity: browser streams are opened on one control plane until it
//     refuses (or this process nears its own open-files limit); each must
//     then carry an event. Its memory (heap and stacks after a garbage
//     collection) with the streams open, against before, per stream.
//   - many: -convs conversations with -viewers browser streams each, every
//     conversation getting -events events -interval apart: the latency
//     from an event's append at the source to its arrival on each browser
//     stream, against one direct reader of the source per conversation.
//   - one: one conversation with -one-viewers browser streams, the same
//     against -one-direct direct readers.
//
// The workers are stood in for by an event source serving the worker API's
// event stream (source.go); the control planes are child processes
// running controlplane.Run, so each has the open-files limit of its own. It
// ends with one line:
//
//	bench-fanout replicas=… streams=… bytes_per_stream=… fanout_p99_ms=… one_conv_viewers=… one_conv_p99_ms=… refused=…
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	replicas, streams, capConvs    int
	convs, viewers, events         int
	interval                       time.Duration
	oneViewers, oneDirect, oneEvts int
	oneInterval                    time.Duration
	phases                         string
}

func main() {
	if v := os.Getenv(envChild); v != "" {
		os.Unsetenv(envChild)
		if v == "source" {
			sourceMain()
		}
		cpMain(strings.Fields(strings.TrimPrefix(v, "cp ")))
		return
	}
	var o options
	flag.IntVar(&o.replicas, "replicas", 1, "control-plane processes; many and one spread their streams over them, capacity uses the first")
	flag.IntVar(&o.streams, "streams", 0, "capacity: streams to open at most (0: until refused or this process nears its open-files limit)")
	flag.IntVar(&o.capConvs, "capacity-convs", 100, "capacity: conversations the streams are spread over")
	flag.IntVar(&o.convs, "convs", 1000, "many: conversations")
	flag.IntVar(&o.viewers, "viewers", 10, "many: browser streams per conversation")
	flag.IntVar(&o.events, "events", 10, "many: events per conversation")
	flag.DurationVar(&o.interval, "interval", time.Second, "many: time between a conversation's events")
	flag.IntVar(&o.oneViewers, "one-viewers", 10000, "one: browser streams of the one conversation")
	flag.IntVar(&o.oneDirect, "one-direct", 100, "one: direct readers of the source (the baseline)")
	flag.IntVar(&o.oneEvts, "one-events", 20, "one: events")
	flag.DurationVar(&o.oneInterval, "one-interval", 250*time.Millisecond, "one: time between events")
	flag.StringVar(&o.phases, "phases", "capacity,many,one", "phases to run")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-fanout:", err)
		os.Exit(1)
	}
}

// child is a child process of this binary.
type child struct {
	cmd   *exec.Cmd
	addrs []string // what it printed on its first line
}

func startChild(part string) (*child, error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envChild+"="+part)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("%s did not start: %w", part, err)
	}
	return &child{cmd: cmd, addrs: strings.Fields(line)}, nil
}

func (c *child) stop() {
	c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		c.cmd.Process.Kill()
		<-done
	}
}

type bench struct {
	o      options
	source string
	cps    []*child
}

func run(o options) error {
	dir, err := os.MkdirTemp("", "bench-fanout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	src, err := startChild("source")
	if err != nil {
		return err
	}
	defer src.stop()
	b := &bench{o: o, source: src.addrs[0]}
	total := o.capConvs + o.convs + 1
	for i := range o.replicas {
		d := fmt.Sprintf("%s/cp%d", dir, i)
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
		c, err := startChild(fmt.Sprintf("cp %s %s %d", d, b.source, total))
		if err != nil {
			return err
		}
		defer c.stop()
		b.cps = append(b.cps, c)
	}
	for _, c := range b.cps {
		if err := waitHealthy(c.addrs[0]); err != nil {
			return err
		}
	}
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	fmt.Printf("# bench-fanout: %d CPUs (GOMAXPROCS %d), %s/%s; open-files limit %d; %d control plane(s), one event source\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, lim.Cur, o.replicas)
	line := map[string]string{"replicas": strconv.Itoa(o.replicas)}
	if strings.Contains(o.phases, "capacity") {
		if err := b.capacity(line); err != nil {
			return err
		}
	}
	if strings.Contains(o.phases, "many") {
		convs := make([]string, o.convs)
		for i := range convs {
			convs[i] = convID(o.capConvs + i)
		}
		p99, err := b.latency("many", convs, o.viewers, 1, o.events, o.interval)
		if err != nil {
			return err
		}
		line["fanout_p99_ms"] = fmt.Sprintf("%.1f", p99)
	}
	if strings.Contains(o.phases, "one") {
		conv := convID(o.capConvs + o.convs)
		p99, err := b.latency("one", []string{conv}, o.oneViewers, o.oneDirect, o.oneEvts, o.oneInterval)
		if err != nil {
			return err
		}
		line["one_conv_viewers"] = strconv.Itoa(o.oneViewers)
		line["one_conv_p99_ms"] = fmt.Sprintf("%.1f", p99)
	}
	var sb strings.Builder
	sb.WriteString("bench-fanout")
	for _, k := range []string{"replicas", "streams", "bytes_per_stream", "fanout_p99_ms", "one_conv_viewers", "one_conv_p99_ms", "refused"} {
		if v, ok := line[k]; ok {
			fmt.Fprintf(&sb, " %s=%s", k, v)
		}
	}
	fmt.Println(sb.String())
	return nil
}

func waitHealthy(addr string) error {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("control plane %s not ready after 30s", addr)
		}
	}
}

func (b *bench) mem(c *child) (memStats, error) {
	var m memStats
	resp, err := http.Get("http://" + c.addrs[1] + "/bench/mem")
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	return m, json.NewDecoder(resp.Body).Decode(&m)
}

// emit has the source run sc and waits for it.
func (b *bench) emit(sc schedule) error {
	body, _ := json.Marshal(sc)
	resp, err := http.Post("http://"+b.source+"/bench/run", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("source run: %s", resp.Status)
	}
	return nil
}

func browserPath(conv string) string { return "/api/conversations/" + conv + "/stream" }
func sourcePath(conv string) string  { return "/v1/conversations/" + conv + "/events" }

// capacity opens streams on the first control plane until it refuses.
func (b *bench) capacity(line map[string]string) error {
	cp := b.cps[0]
	before, err := b.mem(cp)
	if err != nil {
		return err
	}
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	most := int(lim.Cur) - 256 // this process's own sockets and files
	if b.o.streams > 0 {
		most = min(most, b.o.streams)
	}
	rec := &recorder{}
	start := time.Now()
	ss, err := openMany(most, 32, func(i int) (*stream, error) {
		return openStream(cp.addrs[0], browserPath(convID(i%b.o.capConvs)), userToken, rec)
	})
	var ref *refusal
	switch {
	case err == nil:
	case errors.As(err, &ref) && ref.Status == http.StatusServiceUnavailable && ref.RetryAfter != "":
	default:
		closeAll(ss)
		return fmt.Errorf("capacity: after %d streams: %w", len(ss), err)
	}
	opened := time.Since(start)
	// Past the limit every attempt must be refused the same way.
	refused, other := 0, 0
	if ref != nil {
		for range 20 {
			s, err := openStream(cp.addrs[0], browserPath(convID(0)), userToken, rec)
			switch {
			case errors.As(err, &ref) && ref.Status == http.StatusServiceUnavailable && ref.RetryAfter != "":
				refused++
			case err == nil:
				ss = append(ss, s)
			default:
				other++
			}
		}
	}
	after, err := b.mem(cp)
	if err != nil {
		closeAll(ss)
		return err
	}
	convs := make([]string, b.o.capConvs)
	for i := range convs {
		convs[i] = convID(i)
	}
	if err := b.emit(schedule{Convs: convs, Events: 1, Interval: time.Second}); err != nil {
		closeAll(ss)
		return err
	}
	missing := waitGot(ss, 1, 60*time.Second)
	closeAll(ss)
	n := len(ss)
	per := float64((after.HeapInuse+after.StackInuse)-(before.HeapInuse+before.StackInuse)) / float64(max(n, 1))
	perRSS := float64(int64(after.RSS)-int64(before.RSS)) / float64(max(n, 1))
	fmt.Printf("capacity: %d streams over %d conversations opened in %.1fs; %d carried an event (%d missed); past them %d of 20 refused with 503 and Retry-After, %d otherwise\n",
		n, b.o.capConvs, opened.Seconds(), n-int(missing), missing, refused, other)
	if ref != nil {
		fmt.Printf("capacity: refusal: %v\n", ref)
	}
	fmt.Printf("capacity: control plane heap+stacks %.1f MB before, %.1f MB with the streams: %.0f bytes per stream (RSS %.0f per stream); goroutines %d → %d\n",
		float64(before.HeapInuse+before.StackInuse)/1e6, float64(after.HeapInuse+after.StackInuse)/1e6, per, perRSS, before.Goroutines, after.Goroutines)
	line["streams"] = strconv.Itoa(n - int(missing))
	line["bytes_per_stream"] = fmt.Sprintf("%.0f", per)
	line["refused"] = strconv.Itoa(refused)
	// Let the control plane see the closes before the next phase.
	time.Sleep(2 * time.Second)
	return nil
}

// latency opens viewers browser streams per conversation (spread over the
// control planes) and direct source readers per conversation, has the
// source emit events to every conversation interval apart, and prints both
// groups' percentiles; it returns the browser streams' p99 in ms.
func (b *bench) latency(name string, convs []string, viewers, direct, events int, interval time.Duration) (float64, error) {
	via, base := &recorder{}, &recorder{}
	vs, err := openMany(len(convs)*viewers, 32, func(i int) (*stream, error) {
		cp := b.cps[i%len(b.cps)]
		return openStream(cp.addrs[0], browserPath(convs[i/viewers]), userToken, via)
	})
	if err != nil {
		closeAll(vs)
		return 0, fmt.Errorf("%s: browser streams: after %d: %w", name, len(vs), err)
	}
	ds, err := openMany(len(convs)*direct, 32, func(i int) (*stream, error) {
		return openStream(b.source, sourcePath(convs[i/direct]), "", base)
	})
	if err != nil {
		closeAll(vs)
		closeAll(ds)
		return 0, fmt.Errorf("%s: direct streams: after %d: %w", name, len(ds), err)
	}
	defer closeAll(vs)
	defer closeAll(ds)
	time.Sleep(time.Second) // the feeds open
	if err := b.emit(schedule{Convs: convs, Events: events, Interval: interval}); err != nil {
		return 0, err
	}
	missV := waitGot(vs, int64(events), 60*time.Second)
	missD := waitGot(ds, int64(events), 10*time.Second)
	vp50, vp99, dp50, dp99 := via.pct(50), via.pct(99), base.pct(50), base.pct(99)
	fmt.Printf("%s: %d conversations × %d browser streams, %d events each %v apart: %d deliveries (%d missing, %d gaps, %d duplicates): p50 %.1f ms p99 %.1f ms\n",
		name, len(convs), viewers, events, interval, via.count(), missV, via.gaps.Load(), via.dups.Load(), vp50, vp99)
	fmt.Printf("%s: baseline, %d direct reader(s) per conversation: %d deliveries (%d missing): p50 %.1f ms p99 %.1f ms; browser/direct p99 %.2f\n",
		name, direct, base.count(), missD, dp50, dp99, vp99/max(dp99, 0.001))
	return vp99, nil
}
