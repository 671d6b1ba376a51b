package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	rpprof "runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/sse"
	"github.com/talkide/talkide/internal/worker/streamjson"
)

// latencies are the stand-in-to-reader latencies of one kind of run.
type latencies struct {
	p50, p99  time.Duration
	n         int
	perSecond float64 // events read per second in the measured window
	events    int     // events read in the measured window
}

type activeResult struct {
	active           int
	direct, platform latencies
	split            latencySplit
	// workerCPU and benchCPU are the CPU time the worker process and this
	// one (the control plane, the development upstream and the browser
	// streams' readers) used in the platform's measured window.
	workerCPU, benchCPU time.Duration
}

// latencySplit divides the platform's latencies at each event's time
// (taken by the worker when it has parsed the stand-in's line, before
// storing it): toWorker is before, after is the store, the relays and the
// reads.
type latencySplit struct{ toWorker, after latencies }

// latenciesOf returns the p50, p99 and count of d.
func latenciesOf(d []time.Duration) latencies {
	return latencies{p50: pct(d, 50), p99: pct(d, 99), n: len(d)}
}

// cpuPerEvent is d per event of l, in microseconds.
func cpuPerEvent(d time.Duration, l latencies) float64 {
	if l.events == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(l.events)
}

// benchActive runs o.active conversations' turns at once, directly and
// through the platform.
func benchActive(o options, work, standin string) (activeResult, error) {
	r := activeResult{active: o.active}
	script := fmt.Sprintf("bench lines=%d gap=%s", o.lines, o.gap)
	fmt.Printf("# active: %d conversations at once, stand-in CLI (%s), turns of %d assistant lines %s apart; 1 warm-up turn, then %d measured turns each\n",
		o.active, o.containment, o.lines, o.gap, o.rounds)

	var err error
	if r.direct, err = activeDirect(o, work, standin, script); err != nil {
		return r, fmt.Errorf("direct: %w", err)
	}
	dir, err := os.MkdirTemp(work, "active-")
	if err != nil {
		return r, err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return r, err
	}
	cc := childConfig{ClaudeBin: standin, Containment: o.containment, AgentReadPaths: filepath.Dir(standin),
		MaxProcesses: o.active + 8, MaxConversations: max(o.active+100, 1000), UIDCount: 100000}
	if o.pprofDir != "" {
		cc.PprofAddr = "127.0.0.1:6062"
	}
	p, err := startPlatform(dir, filepath.Join(dir, "sessions"), cc)
	if err != nil {
		return r, err
	}
	defer p.close()
	if r.platform, r.workerCPU, r.benchCPU, err = activePlatform(o, p, script, cc.PprofAddr, &r.split); err != nil {
		return r, fmt.Errorf("platform: %w", err)
	}
	fmt.Printf("%-10s %8s %10s %10s %12s\n", "kind", "events", "p50_ms", "p99_ms", "events_per_s")
	for _, k := range []struct {
		name string
		l    latencies
	}{{"direct", r.direct}, {"platform", r.platform}} {
		fmt.Printf("%-10s %8d %10.2f %10.2f %12.0f\n", k.name, k.l.n, ms(k.l.p50), ms(k.l.p99), k.l.perSecond)
	}
	fmt.Printf("# platform's latency split at the worker's event time: to the worker p50 %.2f ms p99 %.2f ms; from there to the browser p50 %.2f ms p99 %.2f ms\n",
		ms(r.split.toWorker.p50), ms(r.split.toWorker.p99), ms(r.split.after.p50), ms(r.split.after.p99))
	fmt.Printf("# direct: the bench reads each stand-in's stdout pipe; platform: stand-in → worker (stored, fsynced) → control plane → browser SSE; latency from the stand-in's write to the bench's read\n")
	fmt.Printf("# CPU in the platform's measured window (%d events): worker %s (%.0f µs per event), control plane with the upstream and the readers %s (%.0f µs per event)\n",
		r.platform.events, r.workerCPU.Round(time.Millisecond), cpuPerEvent(r.workerCPU, r.platform),
		r.benchCPU.Round(time.Millisecond), cpuPerEvent(r.benchCPU, r.platform))
	return r, nil
}

// rounds runs every conversation's warm-up turn, then its measured turns
// together; turn runs one turn of conversation i and returns its
// latencies and the events it read.
func rounds(o options, onMeasure func(), turn func(i int) ([]time.Duration, int, error)) (latencies, error) {
	var l latencies
	var mu sync.Mutex
	var all []time.Duration
	events := 0
	var firstErr error
	var wg sync.WaitGroup
	warm := make(chan struct{})
	ready := sync.WaitGroup{}
	ready.Add(o.active)
	var t0 time.Time
	for i := range o.active {
		wg.Go(func() {
			_, _, err := turn(i)
			ready.Done()
			if err != nil {
				mu.Lock()
				firstErr = err
				mu.Unlock()
				return
			}
			<-warm
			for range o.rounds {
				d, n, err := turn(i)
				mu.Lock()
				all = append(all, d...)
				events += n
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	ready.Wait()
	if onMeasure != nil {
		onMeasure()
	}
	t0 = time.Now()
	close(warm)
	wg.Wait()
	if firstErr != nil {
		return l, firstErr
	}
	l = latenciesOf(all)
	l.perSecond = float64(events) / time.Since(t0).Seconds()
	l.events = events
	return l, nil
}

// activeDirect runs the stand-ins as children of the bench, read through
// pipes: the baseline.
func activeDirect(o options, work, standin, script string) (latencies, error) {
	type child struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		r   *streamjson.Reader
	}
	children := make([]*child, o.active)
	defer func() {
		for _, c := range children {
			if c != nil {
				c.in.Close()
				c.cmd.Wait()
			}
		}
	}()
	for i := range children {
		cmd := exec.Command(standin)
		cmd.Dir = work
		in, err := cmd.StdinPipe()
		if err != nil {
			return latencies{}, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return latencies{}, err
		}
		if err := cmd.Start(); err != nil {
			return latencies{}, err
		}
		children[i] = &child{cmd: cmd, in: in, r: streamjson.NewReader(bufio.NewReader(out))}
	}
	return rounds(o, nil, func(i int) ([]time.Duration, int, error) {
		c := children[i]
		if _, err := c.in.Write(streamjson.UserInput(script, "")); err != nil {
			return nil, 0, err
		}
		var ds []time.Duration
		n := 0
		for {
			line, err := c.r.Next()
			if err != nil {
				return ds, n, err
			}
			now := time.Now()
			n++
			m, err := streamjson.Parse(line)
			if err != nil {
				return ds, n, err
			}
			switch m := m.(type) {
			case *streamjson.Assistant:
				for _, b := range m.Message.Blocks() {
					if at, ok := sentAt(b.Text); ok {
						ds = append(ds, now.Sub(at))
					}
				}
			case *streamjson.Result:
				return ds, n, nil
			}
		}
	})
}

// activePlatform runs the same turns through the platform: messages sent
// through the browser API, events read from the browser streams. It
// fills sp with the latencies' split.
func activePlatform(o options, p *platform, script, pprofAddr string, sp *latencySplit) (l latencies, workerCPU, benchCPU time.Duration, err error) {
	type conv struct {
		id   string
		body io.Closer
		r    *sse.Reader
	}
	convs := make([]*conv, o.active)
	defer func() {
		for _, c := range convs {
			if c != nil {
				c.body.Close()
			}
		}
	}()
	for i := range convs {
		id, err := p.newConversation()
		if err != nil {
			return l, 0, 0, err
		}
		req, _ := http.NewRequest("GET", p.cpURL+"/api/conversations/"+id+"/stream", nil)
		req.Header.Set("Authorization", "Bearer "+p.userToken)
		resp, err := p.hc.Do(req)
		if err != nil {
			return l, 0, 0, err
		}
		if resp.StatusCode != 200 {
			resp.Body.Close()
			return l, 0, 0, fmt.Errorf("open stream: %d", resp.StatusCode)
		}
		convs[i] = &conv{id: id, body: resp.Body, r: sse.NewReader(bufio.NewReader(resp.Body))}
	}
	var prof func() error
	var w0, b0 procStats
	var split struct {
		sync.Mutex
		measuring       bool
		toWorker, after []time.Duration
	}
	onMeasure := func() {
		w0, _ = readProc(p.w.pid())
		b0, _ = readProc(os.Getpid())
		split.Lock()
		split.measuring = true
		split.Unlock()
	}
	if pprofAddr != "" {
		d := time.Duration(o.rounds)*time.Duration(o.lines)*o.gap - time.Second
		cpu := onMeasure
		onMeasure = func() {
			cpu()
			prof = profile("http://"+pprofAddr, filepath.Join(o.pprofDir, "worker-active.pprof"), max(d, 10*time.Second))
			// This process too: the control plane, the development
			// upstream and the browser clients.
			if f, err := os.Create(filepath.Join(o.pprofDir, "controlplane-active.pprof")); err == nil {
				if err := rpprof.StartCPUProfile(f); err == nil {
					time.AfterFunc(max(d, 10*time.Second), func() { rpprof.StopCPUProfile(); f.Close() })
				}
			}
		}
	}
	l, err = rounds(o, onMeasure, func(i int) ([]time.Duration, int, error) {
		c := convs[i]
		if _, err := p.api("POST", "/api/conversations/"+c.id+"/messages", map[string]string{"text": script}, nil); err != nil {
			return nil, 0, err
		}
		var ds []time.Duration
		n := 0
		for {
			e, err := c.r.Next()
			if err != nil {
				return ds, n, err
			}
			now := time.Now()
			n++
			var ev contract.Event
			if err := json.Unmarshal(e.Data, &ev); err != nil {
				return ds, n, err
			}
			switch ev.Type {
			case contract.EventAssistantText:
				var at contract.AssistantText
				if err := json.Unmarshal(ev.Data, &at); err != nil {
					return ds, n, err
				}
				if t, ok := sentAt(at.Text); ok {
					ds = append(ds, now.Sub(t))
					split.Lock()
					if split.measuring {
						split.toWorker = append(split.toWorker, ev.Time.Sub(t))
						split.after = append(split.after, now.Sub(ev.Time))
					}
					split.Unlock()
				}
			case contract.EventTurnCompleted:
				return ds, n, nil
			case contract.EventTurnFailed:
				return ds, n, fmt.Errorf("turn failed: %s", ev.Data)
			}
		}
	})
	w1, _ := readProc(p.w.pid())
	b1, _ := readProc(os.Getpid())
	sp.toWorker, sp.after = latenciesOf(split.toWorker), latenciesOf(split.after)
	if prof != nil {
		if perr := prof(); perr != nil {
			fmt.Printf("# pprof: %v\n", perr)
		}
	}
	return l, w1.CPU - w0.CPU, b1.CPU - b0.CPU, err
}

// sentAt reads the stand-in's write time from its text (see
// standin.SentAt; a main package cannot be imported).
func sentAt(text string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(text, "bench-ts=")
	if !ok {
		return time.Time{}, false
	}
	ns, _, _ := strings.Cut(rest, " ")
	var n int64
	if _, err := fmt.Sscan(ns, &n); err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, n), true
}
