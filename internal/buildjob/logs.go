package buildjob

import (
	"bufio"
	"context"
	"errors"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxLogLine is the longest log line passed on; longer ones are cut.
const MaxLogLine = 16 << 10

// FollowLogs streams the log of the build's container in pod to line, one
// call per line, until the container ends and its log is read to the end,
// or ctx ends. A dropped stream is resumed from the last line's timestamp
// (the kubelet's, asked for with every line), lines at that same instant
// already passed on being skipped, so no line is passed twice or lost
// while the log exists. Logs are for watching progress only: a node's log
// rotation can lose lines, so results are read from the build's files.
func (d *Dispatcher) FollowLogs(ctx context.Context, pod, container string, line func(string)) error {
	d.init()
	var since *metav1.Time
	seenAtSince := map[string]int{} // lines passed on at the instant since
	for attempt := 0; ; attempt++ {
		done, err := d.followOnce(ctx, pod, container, &since, seenAtSince, line)
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
func (d *Dispatcher) followOnce(ctx context.Context, pod, container string, since **metav1.Time, seen map[string]int, line func(string)) (bool, error) {
	opts := &corev1.PodLogOptions{Container: container, Follow: true, Timestamps: true}
	if *since != nil {
		opts.SinceTime = *since
	}
	rc, err := d.Kube.CoreV1().Pods(d.Namespace).GetLogs(pod, opts).Stream(ctx)
	if err != nil {
		return false, err
	}
	defer rc.Close()
	r := bufio.NewReaderSize(rc, 64<<10)
	counted := map[string]int{}
	for {
		raw, err := readLine(r)
		if raw != "" {
			ts, text, ok := strings.Cut(raw, " ")
			t, perr := time.Parse(time.RFC3339Nano, ts)
			if !ok || perr != nil {
				text = raw // not timestamped: pass it on as it is
			} else {
				key := ts + " " + text
				counted[key]++
				if *since != nil && t.Equal((*since).Time) && counted[key] <= seen[key] {
					continue // passed on before the stream dropped
				}
				if *since == nil || t.After((*since).Time) {
					*since = &metav1.Time{Time: t}
					clear(seen)
				}
				seen[key]++
			}
			line(text)
		}
		if err != nil {
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
