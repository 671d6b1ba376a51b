// Package localrun runs the whole platform on one machine (`make run`): the
// control plane on SQLite, one worker for tenant demo / env dev as its own OS
// process (restarted when it dies, like a pod), and the development upstream
// unless ANTHROPIC_API_KEY is set. It keeps its state (master key, user
// token, database, session volume, logs) in one directory.
//
// Main entry: Run with a Config. It is a launcher for development and demos,
// not a production process manager; production runs the same binaries on
// Kubernetes.
package localrun

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker/atomicfile"
)

// Config configures Run. Zero values take the defaults noted.
type Config struct {
	// StateDir holds everything the run keeps. Default ".talkide".
	StateDir string
	// HTTPAddr is the control plane's address (TALKIDE_HTTP_ADDR). Default
	// 127.0.0.1:8080.
	HTTPAddr string
	// BinDir holds talkide-controlplane, talkide-worker and
	// talkide-devupstream. Default: the directory of the running executable.
	BinDir string
	// APIKey (ANTHROPIC_API_KEY), when set, makes the real Anthropic API the
	// upstream (UpstreamURL, default https://api.anthropic.com) instead of
	// the development upstream.
	APIKey      string
	UpstreamURL string
	// DevUserToken is the browser user's bearer token
	// (TALKIDE_DEV_USER_TOKEN); generated and kept in StateDir when empty.
	DevUserToken string
	// Tenant and Env of the one worker. Default demo / dev.
	Tenant, Env string
	// ExtraEnv are the user's own TALKIDE_* settings (e.g.
	// TALKIDE_PERMISSION_POLICY=ask, TALKIDE_ADMIN_TOKEN=...), given to the
	// control plane and the worker; each reads its own. The run's settings
	// (addresses, keys, paths) win over them.
	ExtraEnv []string
	// Out receives the banner. Default os.Stdout.
	Out    io.Writer
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.StateDir == "" {
		c.StateDir = ".talkide"
	}
	abs, err := filepath.Abs(c.StateDir)
	if err != nil {
		return err
	}
	c.StateDir = abs
	if c.HTTPAddr == "" {
		c.HTTPAddr = "127.0.0.1:8080"
	}
	if c.BinDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		c.BinDir = filepath.Dir(exe)
	}
	if c.UpstreamURL == "" {
		c.UpstreamURL = "https://api.anthropic.com"
	}
	if c.Tenant == "" {
		c.Tenant, c.Env = "demo", "dev"
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Run starts the platform and blocks until ctx ends, then stops every process.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	// The state dir is searchable but not listable by others: the agents
	// (run as an unprivileged user when this runs as root) must reach their
	// session directories under it, and nothing else. Secrets in it are 0600.
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "logs"), 0o700); err != nil {
		return err
	}
	for _, d := range []string{cfg.StateDir, filepath.Join(cfg.StateDir, "sessions")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return err
		}
	}
	unlock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return err
	}
	defer unlock()
	// A port already taken would leave the control plane restarting in a
	// loop behind a banner that points at someone else's server.
	if ln, err := net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return fmt.Errorf("the control plane's address %s is in use (another TalkIDE run, or another program): stop it or set TALKIDE_HTTP_ADDR: %w", cfg.HTTPAddr, err)
	} else {
		ln.Close()
	}
	if err := recordAddr(cfg.StateDir, cfg.HTTPAddr); err != nil {
		return err
	}
	master, err := loadOrCreateMaster(filepath.Join(cfg.StateDir, "master.key"))
	if err != nil {
		return err
	}
	userToken := cfg.DevUserToken
	if userToken == "" {
		if userToken, err = loadOrCreateSecret(filepath.Join(cfg.StateDir, "dev-user-token")); err != nil {
			return err
		}
	}
	dbPath := filepath.Join(cfg.StateDir, "controlplane.db")
	_ = os.Chmod(dbPath, 0o600) // from runs before controlstore created it private
	identity, err := issueIdentity(ctx, dbPath, master, cfg.Tenant, cfg.Env)
	if err != nil {
		return err
	}
	workerAddr, err := freeAddr()
	if err != nil {
		return err
	}
	cpURL := "http://" + cfg.HTTPAddr

	// /metrics of the control plane and the worker needs this token: the
	// agents are loopback clients too. The user's own TALKIDE_METRICS_TOKEN
	// wins; else it is generated and kept private in the state dir.
	metricsNote := "set by you (TALKIDE_METRICS_TOKEN)"
	metricsToken := userSetting(cfg.ExtraEnv, "TALKIDE_METRICS_TOKEN")
	if metricsToken == "" {
		path := filepath.Join(cfg.StateDir, "metrics-token")
		if metricsToken, err = loadOrCreateSecret(path); err != nil {
			return err
		}
		metricsNote = path
	}

	var procs []*proc
	upstream, upstreamNote := cfg.UpstreamURL, cfg.UpstreamURL+" (ANTHROPIC_API_KEY is set)"
	upstreamKey := cfg.APIKey
	if cfg.APIKey == "" {
		devAddr, err := freeAddr()
		if err != nil {
			return err
		}
		upstream = "http://" + devAddr
		upstreamNote = "the development upstream at " + upstream + " (set ANTHROPIC_API_KEY to use the real API)"
		// The development upstream answers only the control plane: a key of
		// this run, held by it and the control plane (as its upstream API
		// key) and by nobody else, so an agent on this host cannot call it
		// past the gateway and the budget. Never written to disk.
		if upstreamKey, err = newSecret("sk-dev-"); err != nil {
			return err
		}
		procs = append(procs, &proc{name: "devupstream", bin: filepath.Join(cfg.BinDir, "talkide-devupstream"),
			env: []string{"TALKIDE_DEVUPSTREAM_ADDR=" + devAddr, "TALKIDE_DEVUPSTREAM_API_KEY=" + upstreamKey}})
	}
	cpEnv := []string{
		"TALKIDE_HTTP_ADDR=" + cfg.HTTPAddr,
		"TALKIDE_DB_PATH=" + dbPath,
		"TALKIDE_MASTER_KEYS=" + master.String(),
		"TALKIDE_UPSTREAM_URL=" + upstream,
		"TALKIDE_WORKER_URL_TEMPLATE=http://" + workerAddr,
		"TALKIDE_DEV_USER_TOKEN=" + userToken,
		"TALKIDE_DEV_GRANTS=" + cfg.Tenant + "/" + cfg.Env,
		"TALKIDE_HEALTH_WORKERS=" + cfg.Tenant + "/" + cfg.Env,
		"TALKIDE_METRICS_TOKEN=" + metricsToken,
		"ANTHROPIC_API_KEY=" + upstreamKey, // only the control plane holds the key
	}
	procs = append(procs, &proc{name: "controlplane", bin: filepath.Join(cfg.BinDir, "talkide-controlplane"), env: append(slices.Clone(cfg.ExtraEnv), cpEnv...)})
	procs = append(procs, &proc{name: "worker", bin: filepath.Join(cfg.BinDir, "talkide-worker"), env: append(slices.Clone(cfg.ExtraEnv),
		"TALKIDE_TENANT="+cfg.Tenant,
		"TALKIDE_ENV="+cfg.Env,
		"TALKIDE_WORKER_ADDR="+workerAddr,
		"TALKIDE_WORKER_REQUEST_KEYS="+token.FormatKey(master.Derive(token.PurposeWorkerRequest, cfg.Tenant, cfg.Env)),
		"TALKIDE_GATEWAY_BASE_URL="+cpURL,
		"TALKIDE_WORKER_IDENTITY_TOKEN="+identity,
		"TALKIDE_SESSION_DIR="+filepath.Join(cfg.StateDir, "sessions", cfg.Tenant+"-"+cfg.Env),
		"TALKIDE_CLI_TMP_DIR="+filepath.Join(cfg.StateDir, "cli-tmp"),
		"TALKIDE_METRICS_TOKEN="+metricsToken,
	)})
	for _, p := range procs {
		if _, err := os.Stat(p.bin); err != nil {
			return fmt.Errorf("%s binary missing (run `make build`): %w", p.name, err)
		}
		p.logPath = filepath.Join(cfg.StateDir, "logs", p.name+".log")
		p.log = cfg.Logger.With("process", p.name)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		supervise(ctx, procs)
	}()
	what := "the control plane and the worker (" + cfg.Tenant + "/" + cfg.Env + ")"
	if cfg.APIKey == "" {
		what += " and the development upstream"
	}
	progress := func(waited time.Duration, last error) {
		why := ""
		var ue *url.Error
		switch {
		case errors.As(last, &ue):
			why = " (the control plane does not answer yet)"
		case last != nil:
			why = " (" + last.Error() + ")"
		}
		fmt.Fprintf(cfg.Out, "still starting %s after %s%s: normal on a first start, when the worker checks the CLI and its jail; it gives up after 90 s\n", what, waited.Round(time.Second), why)
	}
	if err := waitHealthy(ctx, cpURL+"/healthz", 90*time.Second, procs, progress); err != nil {
		cancel()
		<-done
		return fmt.Errorf("platform did not become healthy (see %s): %w", filepath.Join(cfg.StateDir, "logs"), err)
	}
	fmt.Fprintf(cfg.Out, `
TalkIDE is running.

  Open in a browser:  %[1]s/#token=%[2]s
  User token:         %[2]s   (Authorization: Bearer <token>)
  Tenant / env:       %[3]s / %[4]s
  Model upstream:     %[5]s
  State and logs:     %[6]s
  Metrics token:      %[7]s   (GET /metrics: Authorization: Bearer <token>)
  Another user:       %[8]s   (prints their URL and token)
  Permissions:        %[9]s

Try it from a shell:
  T=%[2]s
  J='Content-Type: application/json'
  C=$(curl -s -H "Authorization: Bearer $T" -H "$J" -d '{"tenant":"%[3]s","env":"%[4]s"}' %[1]s/api/conversations | sed 's/.*"id":"\([^"]*\)".*/\1/')
  curl -s -H "Authorization: Bearer $T" -H "$J" -d '{"text":"please run `+"`echo hello-from-talkide`"+`"}' %[1]s/api/conversations/$C/messages
  curl -sN -H "Authorization: Bearer $T" %[1]s/api/conversations/$C/stream

Stop with Ctrl-C.
`, cpURL, userToken, cfg.Tenant, cfg.Env, upstreamNote, cfg.StateDir, metricsNote, addUserCommand(cfg.StateDir, cfg.BinDir), permissionNote(cfg.ExtraEnv))
	<-done
	return nil
}

// permissionNote says in the banner whether the agent asks before each
// shell command, and how to have it ask: by the policy extraEnv sets
// (TALKIDE_PERMISSION_POLICY), the worker's default (allow) otherwise.
func permissionNote(extraEnv []string) string {
	policy := ""
	for _, kv := range extraEnv {
		if v, ok := strings.CutPrefix(kv, "TALKIDE_PERMISSION_POLICY="); ok {
			policy = v
		}
	}
	if policy == "ask" {
		return "every shell command waits for your Allow or Deny in the page (TALKIDE_PERMISSION_POLICY=ask)"
	}
	return "commands run in the agent's jail without asking; `TALKIDE_PERMISSION_POLICY=ask make run` asks you first"
}

// addUserCommand is the command line that adds a user to this run: with
// the state dir named when it is not the default (user add would not find
// it otherwise).
func addUserCommand(state, binDir string) string {
	cmd := filepath.Join(binDir, "talkide") + " user add NAME"
	if def, err := filepath.Abs(".talkide"); err != nil || def != state {
		cmd = "TALKIDE_STATE_DIR=" + state + " " + cmd
	}
	return cmd
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func loadOrCreateMaster(path string) (token.MasterKey, error) {
	if b, err := os.ReadFile(path); err == nil {
		return token.ParseMasterKey(strings.TrimSpace(string(b)))
	} else if !errors.Is(err, os.ErrNotExist) {
		return token.MasterKey{}, err
	}
	mk, err := token.NewMasterKey("local1")
	if err != nil {
		return mk, err
	}
	return mk, atomicfile.WriteFile(path, []byte(mk.String()+"\n"), 0o600)
}

func loadOrCreateSecret(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	s, err := newSecret("tk_")
	if err != nil {
		return "", err
	}
	return s, atomicfile.WriteFile(path, []byte(s+"\n"), 0o600)
}

// newSecret returns prefix and 24 random bytes, base64url.
func newSecret(prefix string) (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b), nil
}

// userSetting returns the value of name among the user's NAME=value
// settings, "" when absent.
func userSetting(env []string, name string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

func issueIdentity(ctx context.Context, dbPath string, master token.MasterKey, tenant, env string) (string, error) {
	db, err := controlstore.OpenSQLite(ctx, dbPath)
	if err != nil {
		return "", err
	}
	defer db.Close()
	return mint.New(db, master, slog.New(slog.DiscardHandler)).IssueIdentity(ctx, tenant, env, 0)
}

// slowStartReports are when waitHealthy reports a start that takes long.
var slowStartReports = []time.Duration{10 * time.Second, 30 * time.Second, 60 * time.Second}

// waitHealthy polls url until it answers 200. It gives up early when a
// process keeps dying before the platform is up, naming it and quoting the
// end of its log. A start that takes long is reported to progress (when
// not nil) after 10, 30 and 60 s, with what healthz last said; a quick one
// says nothing.
func waitHealthy(ctx context.Context, url string, limit time.Duration, procs []*proc, progress func(waited time.Duration, last error)) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	start := time.Now()
	reports := slices.Clone(slowStartReports)
	ownUpstream := slices.ContainsFunc(procs, func(p *proc) bool { return p.name == "devupstream" })
	for {
		for _, p := range procs {
			if p.misconfigured.Load() {
				return fmt.Errorf("%s refused its configuration; the end of %s:\n%s", p.name, p.logPath, tail(p.logPath, p.logStart.Load(), 15))
			}
			if n := p.exits.Load(); n >= 3 {
				return fmt.Errorf("%s exited %d times while starting; the end of %s:\n%s", p.name, n, p.logPath, tail(p.logPath, p.logStart.Load(), 15))
			}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var eb contract.ErrorBody
			_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&eb)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("healthz answered %d: %s", resp.StatusCode, eb.Error.Message)
			if strings.HasPrefix(eb.Error.Message, "model upstream ") && !ownUpstream {
				// The control plane checked the upstream (with a timeout of
				// its own): waiting longer only delays the news. Not so for
				// the development upstream, started with it: the control
				// plane may have checked before it listened, and checks
				// again within seconds.
				return err
			}
		}
		last = err
		if waited := time.Since(start); len(reports) > 0 && waited >= reports[0] {
			reports = reports[1:]
			if progress != nil {
				progress(waited, last)
			}
		}
		select {
		case <-ctx.Done():
			return last
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// lockStateDir takes an exclusive lock on the state dir (a local directory,
// so flock is reliable here), so two runs never share one session volume.
func lockStateDir(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, "run.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another TalkIDE run uses the state dir %s (stop it, or set TALKIDE_STATE_DIR to another directory)", dir)
	}
	return func() { f.Close() }, nil
}

// tail returns the last n lines of a file written after its first from
// bytes (what the last run of a process wrote).
func tail(path string, from int64, n int) string {
	b, _ := os.ReadFile(path)
	if from > 0 && from <= int64(len(b)) {
		b = b[from:]
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
