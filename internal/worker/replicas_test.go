package worker_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/controlplane/workerclient"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/testlane"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker"
	"github.com/talkide/talkide/internal/worker/claudecli"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// replica is one worker process (in-process) of a tenant-env.
type replica struct {
	url    string
	client *workerclient.Client
	stop   func()
}

func startReplica(t *testing.T, id, sessionDir string, up *url.URL, master token.MasterKey, leaseBackend string) *replica {
	t.Helper()
	testlane.NeedsCLI(t)
	bin, err := claudecli.Find()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("TALKIDE_TEST_LOGS") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("replica", id)
	}
	key := master.Derive(token.PurposeWorkerRequest, "acme", "dev")
	cfg := worker.Config{Tenant: "acme", Env: "dev", RequestKeys: []token.Key{key}, NoOpUpstream: up,
		SessionDir: sessionDir, ClaudeBin: bin, WorkerID: id, ShutdownGrace: 10 * time.Second, Logger: log, MetricsToken: testMetricsToken,
		LeaseBackend: leaseBackend}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := worker.Run(ctx, cfg, ln); err != nil {
			t.Errorf("replica %s: %v", id, err)
		}
	}()
	u, _ := url.Parse("http://" + ln.Addr().String())
	r := &replica{url: u.String(), client: workerclient.New(u, "acme", "dev", key)}
	var once sync.Once
	r.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(r.stop)
	deadline := time.Now().Add(30 * time.Second)
	for r.client.Ready(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s not ready", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return r
}

// follow reads conv's events through r until stop returns true. Its bound
// only guards against a hang: the real CLI can take a minute to start on a
// loaded machine.
func follow(t *testing.T, r *replica, conv string, after int64, stop func(contract.Event) bool) []contract.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var got []contract.Event
	for ctx.Err() == nil {
		es, err := r.client.Events(ctx, conv, after)
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for {
			ev, err := es.Next()
			if err != nil {
				break
			}
			got = append(got, ev)
			after = ev.ID
			if stop(ev) {
				es.Close()
				return got
			}
		}
		es.Close()
	}
	t.Fatalf("no matching event on %s; got %v", conv, got)
	return nil
}

func turnEnd(ev contract.Event) bool {
	return ev.Type == contract.EventTurnCompleted || ev.Type == contract.EventTurnFailed
}

// TestRollingUpdate runs two replicas on one session volume: requests that
// reach the replica not owning a conversation are forwarded to the owner
// (commands and the event stream), and when the owner shuts down (SIGTERM in
// a rolling update) a message accepted during its shutdown is run by the
// other replica, with the history and without a gap in the events. It runs
// with the leases as files on the volume and as Leases on the real API
// server, where the replicas act as the worker's ServiceAccount with
// exactly the Role the provisioner gives it (KUBECONFIG from its token, as
// in its pod).
func TestRollingUpdate(t *testing.T) {
	t.Run("file", func(t *testing.T) { testRollingUpdate(t, "file") })
	t.Run("kubernetes", func(t *testing.T) {
		c := kubetest.Shared(t)
		ns := c.Namespace(t)
		t.Setenv("KUBECONFIG", kubetest.WriteKubeconfig(t, c.ServiceAccountConfig(t, ns, provision.WorkerName, provision.WorkerRules()), ns))
		t.Setenv("POD_NAMESPACE", ns)
		testRollingUpdate(t, "kubernetes")
		leases, err := c.Client().CoordinationV1().Leases(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil || len(leases.Items) == 0 {
			t.Fatalf("no Leases in %s: %v", ns, err)
		}
	})
}

func testRollingUpdate(t *testing.T, leaseBackend string) {
	vol := platformtest.AgentReachableTempDir(t)
	up := devupstream.New(devupstream.Config{})
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()
	upURL, _ := url.Parse(upSrv.URL)
	master, _ := token.NewMasterKey("k1")
	old := startReplica(t, "worker-old", vol, upURL, master, leaseBackend)
	next := startReplica(t, "worker-new", vol, upURL, master, leaseBackend)
	ctx := context.Background()
	mreq, _ := http.NewRequest("GET", old.url+"/metrics", nil)
	mreq.Header.Set("Authorization", "Bearer "+testMetricsToken)
	resp, err := http.DefaultClient.Do(mreq)
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"talkide_worker_cli_processes", "talkide_worker_turns_waiting", "talkide_worker_conversations_loaded"} {
		if resp.StatusCode != 200 || !strings.Contains(string(metrics), name) {
			t.Errorf("GET /metrics: status %d, no %s", resp.StatusCode, name)
		}
	}

	if _, err := old.client.CreateSession(ctx, "c1", contract.CreateSessionRequest{UserID: "u1"}); err != nil {
		t.Fatal(err)
	}
	// Sent to the replica that does not own the conversation: forwarded.
	if _, err := next.client.SendMessage(ctx, "c1", contract.SendMessageRequest{ClientMessageID: "m1", UserID: "u1", Text: "please run `echo before-update`"}); err != nil {
		t.Fatalf("send through the other replica: %v", err)
	}
	evs := follow(t, next, "c1", 0, turnEnd)
	if last := evs[len(evs)-1]; last.Type != contract.EventTurnCompleted {
		t.Fatalf("first turn: %s %s", last.Type, last.Data)
	}
	st, err := next.client.Status(ctx, "c1")
	if err != nil || st.SessionID == "" {
		t.Fatalf("status through the other replica: %+v %v", st, err)
	}

	// The old replica shuts down; a message arrives at it meanwhile.
	stopped := make(chan struct{})
	go func() { old.stop(); close(stopped) }()
	var sendErr error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_, sendErr = old.client.SendMessage(ctx, "c1", contract.SendMessageRequest{ClientMessageID: "m2", UserID: "u1", Text: "please run `echo after-update`"})
		if sendErr == nil || errors.Is(sendErr, workerclient.ErrUnavailable) {
			break
		}
	}
	<-stopped
	if sendErr != nil {
		// The old replica was already gone: the control plane's retry sends
		// it to the new one.
		if _, err := next.client.SendMessage(ctx, "c1", contract.SendMessageRequest{ClientMessageID: "m2", UserID: "u1", Text: "please run `echo after-update`"}); err != nil {
			t.Fatalf("send to the new replica: %v", err)
		}
	}
	rest := follow(t, next, "c1", evs[len(evs)-1].ID, func(ev contract.Event) bool {
		return turnEnd(ev) && strings.Contains(string(ev.Data), `"m2"`)
	})
	if last := rest[len(rest)-1]; last.Type != contract.EventTurnCompleted || !strings.Contains(string(last.Data), "after-update") {
		t.Fatalf("turn after the update: %s %s", last.Type, last.Data)
	}
	all := append(evs, rest...)
	for i, ev := range all {
		if ev.ID != int64(i+1) {
			t.Fatalf("event ids across the update: %d at %d", ev.ID, i)
		}
	}
	var history bool
	for _, r := range up.Requests() {
		if strings.Contains(string(r.Body), "after-update") && strings.Contains(string(r.Body), "before-update") {
			history = true
		}
	}
	if !history {
		t.Error("the new replica did not resume the session with its history")
	}
}
