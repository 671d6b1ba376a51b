package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/token"
)

const (
	tenant, env = "bench", "dev"
	userID      = "bench-user"
	userToken   = "tk_bench_fanout"
	// envChild selects a child's part: "source" or "cp <dir> <source addr> <conversations>".
	envChild = "TALKIDE_BENCH_FANOUT_CHILD"
)

// convID names conversation i.
func convID(i int) string { return fmt.Sprintf("bench-conv-%05d", i) }

// memStats is a control plane's memory as /bench/mem reports it, after a
// garbage collection.
type memStats struct {
	HeapInuse  uint64 `json:"heap_inuse"`
	StackInuse uint64 `json:"stack_inuse"`
	RSS        uint64 `json:"rss"`
	Goroutines int    `json:"goroutines"`
}

// cpMain runs a control plane as cmd/talkide-controlplane does
// (controlplane.Run), on SQLite in dir, its workers' URL the event source;
// it seeds one user with conversations 0..n-1 first. It prints its address
// and the address of its /bench/mem on stdout.
func cpMain(args []string) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "bench control plane:", err)
		os.Exit(1)
	}
	if len(args) != 3 {
		fail(fmt.Errorf("want <dir> <source addr> <conversations>, got %q", args))
	}
	dir, src := args[0], args[1]
	n, err := strconv.Atoi(args[2])
	if err != nil {
		fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	master, err := token.NewMasterKey("b1")
	if err != nil {
		fail(err)
	}
	up, _ := url.Parse("http://" + src)
	cfg := controlplane.Config{
		DBPath: filepath.Join(dir, "cp.db"), MasterKeys: []token.MasterKey{master}, Upstream: up, APIKey: "sk-ant-bench",
		WorkerURLTemplate: "http://" + src, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if err := cfg.Validate(); err != nil {
		fail(err)
	}
	db, err := controlstore.OpenSQLite(ctx, cfg.DBPath)
	if err != nil {
		fail(err)
	}
	if err := db.UpsertUser(ctx, controlstore.User{ID: userID, TokenHash: controlstore.HashUserToken(userToken)}, [2]string{tenant, env}); err != nil {
		fail(err)
	}
	now := time.Now().UTC()
	for i := range n {
		err := db.CreateConversation(ctx, controlstore.Conversation{ID: convID(i), Tenant: tenant, Env: env, UserID: userID, CreatedAt: now})
		if err != nil && !strings.Contains(err.Error(), "UNIQUE") {
			fail(err)
		}
	}
	db.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	memLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	go http.Serve(memLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		json.NewEncoder(w).Encode(memStats{HeapInuse: ms.HeapInuse, StackInuse: ms.StackInuse, RSS: rss(), Goroutines: runtime.NumGoroutine()})
	}))
	fmt.Println(ln.Addr().String(), memLn.Addr().String())
	if err := controlplane.Run(ctx, cfg, ln); err != nil {
		fail(err)
	}
}

// rss is this process's resident set, in bytes (0 when unknown).
func rss() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
