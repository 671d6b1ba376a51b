package buildjob

import (
	"context"
	"time"
)

// RunnerKubernetes and RunnerLocal name the runners in a Report.
const (
	RunnerKubernetes = "kubernetes"
	RunnerLocal      = "local"
)

// KubeRunner runs builds as Kubernetes Jobs in the tenant-env's namespace:
// the Job from Gradle, run by Dispatcher (queue, one Job per conversation
// at a time, create or adopt, watch, Pending timeout, cancellation), its
// log followed into Hooks.Line, and its results read from the JUnit files
// it wrote in the conversation's working tree, which the worker sees on
// the same session volume. The finished Job stays until Release.
type KubeRunner struct {
	Dispatcher *Dispatcher
	Gradle     *GradleJobBuilder
	// WorkspaceRoot is the worker's path of the session volume's
	// workspaces directory (the Job mounts workspaces/<conversation> of
	// the same volume). Required.
	WorkspaceRoot string
	// Offline passes --offline: the build resolves nothing from the
	// network (dependencies come from the project or the builder image).
	Offline bool
}

var _ Runner = (*KubeRunner)(nil)

// Run implements Runner. The Job's name comes from req (JobName), so a
// Run repeated after a worker restart follows the Job already there.
func (k *KubeRunner) Run(ctx context.Context, req Request, spec Spec, hooks Hooks) (Report, error) {
	start := time.Now()
	rep := Report{Runner: RunnerKubernetes, ExitCode: -1}
	job, err := k.Gradle.Job(GradleRequest{Request: req, Tasks: spec.Tasks, Tests: spec.Tests, Offline: k.Offline})
	if err != nil {
		return rep, err
	}
	d := k.Dispatcher
	d.init()
	logs := newTail(LogTailLines)
	line := func(s string) {
		logs.add(s)
		hooks.line(s)
	}
	// Logs are followed from the moment the Job exists until its
	// container ended and its log was drained (or the build is over).
	logCtx, stopLogs := context.WithCancel(ctx)
	defer stopLogs()
	logsDone := make(chan struct{})
	following := false
	progress := func(p Progress) {
		hooks.progress(p)
		if p.Started && !following {
			following = true
			go func() {
				defer close(logsDone)
				k.followJobLogs(logCtx, job.Name, line)
			}()
		}
	}
	out, done, err := d.run(ctx, hooks.Detach, job, progress)
	// The conversation's next build starts by removing the reports: it
	// waits until this one's are read.
	defer done()
	rep.Outcome = out
	if following {
		if out.Phase == PhaseCancelled || out.Phase == PhaseDetached {
			stopLogs()
		}
		select {
		case <-logsDone:
		case <-time.After(LogDrain + 5*time.Second):
			stopLogs()
			<-logsDone
		}
	}
	rep.LogTail = logs.get()
	rep.DurationMS = since(start)
	if err != nil {
		return rep, err
	}
	if out.Phase != PhaseCancelled && out.Phase != PhaseDetached {
		rep.ExitCode = k.exitCode(job.Name)
		rep.readResults(k.WorkspaceRoot, req)
	}
	return rep, nil
}

// Release deletes req's build Job (Dispatcher.Delete: at once, its pod by
// background propagation) once the caller has delivered the build's
// report, so that finished Jobs do not hold the namespace's Job quota.
// Call it only then: a worker that restarts before the delivery follows
// the Job again to deliver it. A Job already gone is no error; errors are
// the API's.
func (k *KubeRunner) Release(ctx context.Context, req Request) error {
	return k.Dispatcher.Delete(ctx, JobName(KindGradle, req.Conversation, req.ID))
}

// followJobLogs waits for the Job's pod to exist and follows its log.
func (k *KubeRunner) followJobLogs(ctx context.Context, job string, line func(string)) {
	d := k.Dispatcher
	for {
		pod, err := d.buildPod(ctx, job)
		if pod != nil && pod.Status.Phase != "Pending" {
			if err := d.FollowLogs(ctx, pod.Name, "gradle", line); err != nil && ctx.Err() == nil {
				d.Logger.Warn("follow build log", "namespace", d.Namespace, "pod", pod.Name, "err", err)
			}
			return
		}
		if err != nil && ctx.Err() == nil {
			d.Logger.Debug("look for build pod", "job", job, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// exitCode is the build container's exit status, -1 when its pod or status
// is gone.
func (k *KubeRunner) exitCode(job string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pod, err := k.Dispatcher.buildPod(ctx, job)
	if err != nil || pod == nil {
		return -1
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			return int(t.ExitCode)
		}
	}
	return -1
}
