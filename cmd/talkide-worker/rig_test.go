package main

import (
	"context"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
)

// rig is what a worker process is tested behind: a development upstream
// and a control plane (started once the worker's URL is known), for
// tenant demo, env dev, with a database holding the worker's identity
// token.
type rig struct {
	t             *testing.T
	dir, sessions string
	master        token.MasterKey
	tenant, env   string
	userToken     string
	identity      string
	upURL         *url.URL
	cpLn          net.Listener
	cpURL, dbPath string
	log           *slog.Logger
	bin           string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{t: t, bin: platformtest.ClaudeBin(t), dir: platformtest.AgentReachableTempDir(t), tenant: "demo", env: "dev",
		userToken: "tk_test_" + token.NewID(), log: slog.New(slog.DiscardHandler)}
	r.sessions = filepath.Join(r.dir, "sessions")
	r.dbPath = filepath.Join(r.dir, "cp.db")
	var err error
	if r.master, err = token.NewMasterKey("t1"); err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(devupstream.New(devupstream.Config{APIKey: platformtest.UpstreamAPIKey}))
	t.Cleanup(up.Close)
	r.upURL, _ = url.Parse(up.URL)
	if r.cpLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	r.cpURL = "http://" + r.cpLn.Addr().String()
	db := r.openDB()
	defer db.Close()
	if r.identity, err = mint.New(db, r.master, r.log).IssueIdentity(context.Background(), r.tenant, r.env, 0); err != nil {
		t.Fatal(err)
	}
	return r
}

// openDB opens the control plane's database (the caller closes it).
func (r *rig) openDB() *controlstore.DB {
	r.t.Helper()
	db, err := controlstore.OpenSQLite(context.Background(), r.dbPath)
	if err != nil {
		r.t.Fatal(err)
	}
	return db
}

// workerEnv is the worker's environment for this rig, without its identity
// token setting, plus extra.
func (r *rig) workerEnv(extra ...string) []string {
	return append([]string{
		"TALKIDE_TENANT=" + r.tenant, "TALKIDE_ENV=" + r.env, "TALKIDE_WORKER_ADDR=127.0.0.1:0",
		"TALKIDE_WORKER_REQUEST_KEYS=" + token.FormatKey(r.master.Derive(token.PurposeWorkerRequest, r.tenant, r.env)),
		"TALKIDE_GATEWAY_BASE_URL=" + r.cpURL,
		"TALKIDE_SESSION_DIR=" + r.sessions, "TALKIDE_CLAUDE_BIN=" + r.bin,
		"TALKIDE_HOST_UID_DIR=" + filepath.Join(r.dir, "uids"), "TALKIDE_CLI_TMP_DIR=" + filepath.Join(r.dir, "cli-tmp"),
	}, extra...)
}

// startControlPlane runs the control plane in-process for the worker at
// workerURL (adjust, when set, changes its configuration) and returns the
// platform as the browser sees it.
func (r *rig) startControlPlane(workerURL string, adjust func(*controlplane.Config)) *platformtest.Platform {
	t := r.t
	t.Helper()
	cpCfg := controlplane.Config{
		DBPath: r.dbPath, MasterKeys: []token.MasterKey{r.master}, Upstream: r.upURL, APIKey: platformtest.UpstreamAPIKey,
		WorkerURLTemplate: workerURL, DevUserToken: r.userToken, Logger: r.log,
	}
	if adjust != nil {
		adjust(&cpCfg)
	}
	if err := cpCfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cpCtx, stopCP := context.WithCancel(context.Background())
	cpDone := make(chan struct{})
	go func() {
		defer close(cpDone)
		if err := controlplane.Run(cpCtx, cpCfg, r.cpLn); err != nil {
			t.Errorf("control plane: %v", err)
		}
	}()
	t.Cleanup(func() { stopCP(); <-cpDone })
	p := &platformtest.Platform{T: t, URL: r.cpURL, UserToken: r.userToken, Tenant: r.tenant, Env: r.env, WorkerURL: workerURL, SessionDir: r.sessions}
	p.WaitControlPlane()
	return p
}
