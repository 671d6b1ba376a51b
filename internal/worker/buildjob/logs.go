package buildjob

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxLogLine is the longest log line passed on, in bytes; longer ones are
// cut there (the rest of the line is read and dropped).
const MaxLogLine = 16 << 10

// LogDrain is how long a follow stream is read on after its container
// ended, before it is closed and the log's end read (see FollowLogs).
const LogDrain = 2 * time.Second

// errMidLine is a plain read of a terminated container's log that ended
// in the middle of a line, not yet known to be the log's last.
var errMidLine = errors.New("the log read ended in the middle of a line")

// FollowLogs streams the log of container in pod to line, one call per
// line (its text, without the kubelet's timestamp and the newline), until
// the container has terminated and its log is read to the end, or ctx ends.
//
// A line is passed on only once it is whole, ended by its newline: a
// stream cut in the middle of a line drops the fragment, and the next
// stream starts again at the last whole line's timestamp (the kubelet's,
// asked for with every line; SinceTime is inclusive and whole seconds, so
// lines passed on before are skipped by their timestamps). A follow
// stream's end is never taken for the log's: once the container has
// terminated, the log is read once more, without following, from that
// timestamp to its end, and again if that read is cut. A last line without
// a newline is passed on when two such reads of the terminated container's
// log both end with it. So no line is passed on twice, cut or lost while
// the log exists. Logs are for watching progress only: a node's log
// rotation can lose lines, so results are read from the build's files.
//
// It returns nil once the log was read to its end, ctx's error when ctx
// ended first, or an error saying the stream kept dropping (after 100
// attempts, the last one's error with it).
func (d *Dispatcher) FollowLogs(ctx context.Context, pod, container string, line func(string)) error {
	d.init()
	cur := &logCursor{seen: map[string]int{}}
	for attempt := 0; ; attempt++ {
		wasFinal := cur.final
		done, err := d.followOnce(ctx, pod, container, cur, line)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if done {
			return nil
		}
		if attempt >= 100 {
			return errors.New("the build's log stream kept dropping: " + errString(err))
		}
		if cur.final && !wasFinal {
			continue // the container ended: read its log's end at once
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

// followOnce reads the log once from the cursor: a follow stream while the
// container may still log, a plain read to the end once it has terminated
// (cur.final). done: the log was read to its end.
func (d *Dispatcher) followOnce(ctx context.Context, pod, container string, cur *logCursor, line func(string)) (bool, error) {
	final := cur.final
	opts := &corev1.PodLogOptions{Container: container, Follow: !final, Timestamps: true}
	if cur.since != nil {
		opts.SinceTime = cur.since
	}
	cur.restart()
	streamCtx, stop := context.WithCancel(ctx)
	defer stop()
	ended := make(chan struct{})
	if !final {
		// Some kubelets (and kwok) keep a follow stream open after the
		// container ended: once it has, the stream gets LogDrain more to
		// deliver what is left, then is closed, and the log's end is read.
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
	}
	rc, err := d.Kube.CoreV1().Pods(d.Namespace).GetLogs(pod, opts).Stream(streamCtx)
	if err != nil {
		return false, err
	}
	defer rc.Close()
	r := bufio.NewReaderSize(rc, 64<<10)
	for {
		raw, whole, err := readLine(r)
		if whole {
			if text, ok := cur.line(raw); ok {
				line(text)
			}
		}
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		if final {
			switch {
			case !errors.Is(err, io.EOF):
				return false, err
			case raw == "":
				return true, nil // the terminated container's log, to its end
			case raw == cur.tail:
				// Two reads ended with the same line without a newline:
				// the log's last line.
				if text, ok := cur.line(raw); ok {
					line(text)
				}
				return true, nil
			}
			// A cut read ends cleanly too (the API server ends its
			// response when its kubelet connection drops): read again.
			cur.tail = raw
			return false, errMidLine
		}
		// A follow stream ended, whole or cut: once the container has
		// terminated, what is left is read without following.
		select {
		case <-ended:
			cur.final = true
			return false, err
		default:
		}
		p, gerr := d.Kube.CoreV1().Pods(d.Namespace).Get(ctx, pod, metav1.GetOptions{})
		if gerr != nil {
			return false, gerr
		}
		cur.final = terminated(p, container)
		return false, err
	}
}

// readLine reads a line. It returns the line without its newline ("\n" or
// "\r\n"), cut at MaxLogLine bytes (the rest of a longer line is read and
// dropped), and whole: whether it ended with its newline. With an error
// (io.EOF at the end of r), line is what was read of a line without one.
func readLine(r *bufio.Reader) (line string, whole bool, err error) {
	var b []byte
	n := 0 // the line's length, beyond what is kept
	for {
		frag, rerr := r.ReadSlice('\n')
		if rerr == nil {
			frag, whole = frag[:len(frag)-1], true
		}
		n += len(frag)
		if len(b) < MaxLogLine {
			b = append(b, frag[:min(len(frag), MaxLogLine-len(b))]...)
		}
		if errors.Is(rerr, bufio.ErrBufferFull) {
			continue
		}
		if whole && n <= MaxLogLine {
			b = bytes.TrimSuffix(b, []byte{'\r'})
		}
		return string(b), whole, rerr
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
// the last whole line's timestamp (SinceTime is inclusive, and sent in
// whole seconds) passes on no line twice. It remembers only the lines of
// one instant (the last one's, and the one a stream resumed at), never the
// whole log: a build logs as much as it likes.
type logCursor struct {
	since *metav1.Time   // the last line's timestamp
	seen  map[string]int // lines passed on at the instant since
	// resume is the instant the current stream started at, replay the
	// lines passed on at it before, counted the current stream's lines at
	// it.
	resume  *metav1.Time
	replay  map[string]int
	counted map[string]int
	// final: the container has terminated; the log is read to its end
	// without following.
	final bool
	// tail is the line without a newline the last plain read ended with.
	tail string
}

// restart begins a new stream (from since).
func (c *logCursor) restart() {
	c.resume, c.replay, c.counted = c.since, maps.Clone(c.seen), map[string]int{}
}

// line takes a timestamped log line ("<RFC3339Nano> <text>") and returns
// its text, and whether to pass it on: not when an earlier stream passed it
// on already (a resumed stream's lines before the instant it resumed at,
// and as many of that instant as were passed on). A line without a
// timestamp is passed on as it is.
func (c *logCursor) line(raw string) (string, bool) {
	ts, text, ok := strings.Cut(raw, " ")
	t, err := time.Parse(time.RFC3339Nano, ts)
	if !ok || err != nil {
		return raw, true
	}
	key := ts + " " + text
	if c.resume != nil {
		if t.Before(c.resume.Time) {
			return "", false
		}
		if t.Equal(c.resume.Time) {
			c.counted[key]++
			if c.counted[key] <= c.replay[key] {
				return "", false
			}
		}
	}
	if c.since == nil || t.After(c.since.Time) {
		c.since = &metav1.Time{Time: t}
		clear(c.seen)
	}
	c.seen[key]++
	return text, true
}
