package buildjob

import (
	"bufio"
	"context"
	"errors"
	"io"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxLogLine is the longest log line passed on; longer ones are cut.
const MaxLogLine = 16 << 10

// LogDrain is how long a log stream is read after its container ended.
const LogDrain = 2 * time.Second

// FollowLogs streams the log of the build's container in pod to line, one
// call per line, until the container ends and its log is read to the end,
// or ctx ends. A dropped stream is resumed from the last line's timestamp
// (the kubelet's, asked for with every line), lines at that same instant
// already passed on being skipped, so no line is passed twice or lost
// while the log exists. Logs are for watching progress only: a node's log
// rotation can lose lines, so results are read from the build's files.
func (d *Dispatcher) FollowLogs(ctx context.Context, pod, container string, line func(string)) error {
	d.init()
	cur := &logCursor{seen: map[string]int{}}
	for attempt := 0; ; attempt++ {
		done, err := d.followOnce(ctx, pod, container, cur, line)
		if done || ctx.Err() != nil {
			return ctx.Err()
		}
		if attempt >= 100 {
			return errors.New("the build's log stream kept dropping: " + errString(err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(time.Duration(attempt+1)*200*time.Millisecond, 5*time.Second)):
		}
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// followOnce reads one stream; done when it ended with the container
// finished (nothing more will be logged).
func (d *Dispatcher) followOnce(ctx context.Context, pod, container string, cur *logCursor, line func(string)) (bool, error) {
	opts := &corev1.PodLogOptions{Container: container, Follow: true, Timestamps: true}
	if cur.since != nil {
		opts.SinceTime = cur.since
	}
	cur.restart()
	// Some kubelets (and kwok) keep a follow stream open after the
	// container ended: once it has, the stream gets LogDrain more to
	// deliver what is left, then is closed.
	streamCtx, stop := context.WithCancel(ctx)
	defer stop()
	ended := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-streamCtx.Done():
				return
			case <-t.C:
			}
			if p, err := d.Kube.CoreV1().Pods(d.Namespace).Get(streamCtx, pod, metav1.GetOptions{}); err == nil && terminated(p, container) {
				close(ended)
				select {
				case <-streamCtx.Done():
				case <-time.After(LogDrain):
					stop()
				}
				return
			}
		}
	}()
	rc, err := d.Kube.CoreV1().Pods(d.Namespace).GetLogs(pod, opts).Stream(streamCtx)
	if err != nil {
		return false, err
	}
	defer rc.Close()
	r := bufio.NewReaderSize(rc, 64<<10)
	for {
		raw, err := readLine(r)
		if raw != "" {
			if text, ok := cur.line(raw); ok {
				line(text)
			}
		}
		if err != nil {
			select {
			case <-ended:
				if ctx.Err() == nil {
					return true, nil // the container ended and its log was drained
				}
			default:
			}
			if !errors.Is(err, io.EOF) {
				return false, err
			}
			p, gerr := d.Kube.CoreV1().Pods(d.Namespace).Get(ctx, pod, metav1.GetOptions{})
			if gerr != nil {
				return false, gerr
			}
			return terminated(p, container), nil
		}
	}
}

// readLine reads a line without its newline, cut at MaxLogLine (the rest
// of a longer line is skipped).
func readLine(r *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		frag, isPrefix, err := r.ReadLine()
		if b.Len() < MaxLogLine {
			b.Write(frag[:min(len(frag), MaxLogLine-b.Len())])
		}
		if err != nil || !isPrefix {
			return b.String(), err
		}
	}
}

func terminated(p *corev1.Pod, container string) bool {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return true
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container && cs.State.Terminated != nil {
			return true
		}
	}
	return false
}

// logCursor is where a log stream got to, so that a stream resumed from
// the last timestamp (SinceTime is inclusive) passes on no line twice. It
// remembers only the lines of one instant (the last one's, and the one a
// stream resumed at), never the whole log: a build logs as much as it
// likes.
type logCursor struct {
	since *metav1.Time   // the last line's timestamp
	seen  map[string]int // lines passed on at the instant since
	// resume is the instant the current stream started at, replay the
	// lines passed on at it before, counted the current stream's lines at
	// it.
	resume  *metav1.Time
	replay  map[string]int
	counted map[string]int
}

// restart begins a new stream (from since).
func (c *logCursor) restart() {
	c.resume, c.replay, c.counted = c.since, maps.Clone(c.seen), map[string]int{}
}

// line takes a timestamped log line ("<RFC3339Nano> <text>") and returns
// its text, and whether to pass it on: not when an earlier stream passed it
// on already. A line without a timestamp is passed on as it is.
func (c *logCursor) line(raw string) (string, bool) {
	ts, text, ok := strings.Cut(raw, " ")
	t, err := time.Parse(time.RFC3339Nano, ts)
	if !ok || err != nil {
		return raw, true
	}
	key := ts + " " + text
	if c.resume != nil && t.Equal(c.resume.Time) {
		c.counted[key]++
		if c.counted[key] <= c.replay[key] {
			return "", false
		}
	}
	if c.since == nil || t.After(c.since.Time) {
		c.since = &metav1.Time{Time: t}
		clear(c.seen)
	}
	c.seen[key]++
	return text, true
}
