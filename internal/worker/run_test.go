package worker_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/testlane"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker"
	"github.com/talkide/talkide/internal/worker/claudecli"
)

// TestRunReleasesWhatItOpenedWhenItFails: a worker whose start-up fails
// late (here its Kubernetes lease backend has no credentials, after the
// API listener and the local gateway proxy's listener are open) returns
// the error with every file it opened closed, the
// listener it was given among them: a supervisor that retries in the same
// process leaks nothing per attempt.
func TestRunReleasesWhatItOpenedWhenItFails(t *testing.T) {
	testlane.NeedsCLI(t)
	bin, err := claudecli.Find()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "no-such-kubeconfig"))
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	master, _ := token.NewMasterKey("k1")
	cfg := worker.Config{Tenant: "t1", Env: "dev", RequestKeys: []token.Key{master.Derive(token.PurposeWorkerRequest, "t1", "dev")},
		NoOpUpstream: &url.URL{Scheme: "http", Host: "127.0.0.1:9"},
		SessionDir:   filepath.Join(platformtest.AgentReachableTempDir(t), "sessions"), ClaudeBin: bin,
		WorkerID: "t1-worker", LeaseBackend: "kubernetes", ShutdownGrace: time.Second,
		Logger: slog.New(slog.DiscardHandler)}
	if err := os.MkdirAll(cfg.SessionDir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	for attempt := range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		before := openFiles()
		err = worker.Run(context.Background(), cfg, ln)
		if err == nil {
			t.Fatal("Run without lease credentials returned nil")
		}
		t.Logf("attempt %d: %v", attempt, err)
		_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("attempt %d: the listener Run was given is still open (Accept: %v)", attempt, err)
		}
		// The listener was counted before; nothing else is left open.
		if after := openFiles(); after > before-1 {
			t.Fatalf("attempt %d: %d files open before Run (its listener among them), %d after it failed: it left %d open",
				attempt, before, after, after-(before-1))
		}
	}
}

func openFiles() int {
	n, _ := httpapi.OpenFiles(1 << 20)
	return n
}
