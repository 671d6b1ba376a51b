package localrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/worker/atomicfile"
)

// addrFile, in the state dir, holds the control plane's address of the
// last run started there, so that `talkide user add` prints a URL that
// works without being told TALKIDE_HTTP_ADDR again.
const addrFile = "http-addr"

// UserConfig configures AddUser. Zero values take the defaults noted.
type UserConfig struct {
	// StateDir is the run's state dir (TALKIDE_STATE_DIR). Default ".talkide".
	StateDir string
	// Name is the new user's id.
	Name string
	// Tenant and Env the user is granted. Default demo / dev, the run's.
	Tenant, Env string
	// HTTPAddr is the control plane's address for the printed URL
	// (TALKIDE_HTTP_ADDR). Default: the address the last run in StateDir
	// served on, else 127.0.0.1:8080.
	HTTPAddr string
	// Out receives the new user's URL and token. Default os.Stdout.
	Out io.Writer
}

// AddUser creates a browser user with a fresh token in the one-machine
// run's database, granted one tenant-env, and prints the URL that signs it
// in. It works while the run serves (the database is SQLite in WAL mode with
// a busy timeout; the control plane looks tokens up on every request), and
// refuses a name that exists rather than replacing that user's token.
func AddUser(ctx context.Context, cfg UserConfig) error {
	if cfg.StateDir == "" {
		cfg.StateDir = ".talkide"
	}
	if cfg.Tenant == "" {
		cfg.Tenant = "demo"
	}
	if cfg.Env == "" {
		cfg.Env = "dev"
	}
	if cfg.Out == nil {
		cfg.Out = os.Stdout
	}
	if !controlstore.ValidUserID(cfg.Name) {
		return fmt.Errorf("user name %q: want 1 to 128 bytes of UTF-8 without control characters or surrounding spaces", cfg.Name)
	}
	grants, err := controlstore.ParseTenantEnvs(cfg.Tenant + "/" + cfg.Env)
	if err != nil {
		return fmt.Errorf("tenant and env: %w", err)
	}
	state, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return err
	}
	// Creating a database here would give the user to no run: the run
	// starts from its state dir.
	dbPath := filepath.Join(state, "controlplane.db")
	if _, err := os.Stat(dbPath); err != nil {
		return fmt.Errorf("no TalkIDE run has used %s yet (no %s): start the platform once with `make run`, or set TALKIDE_STATE_DIR to the state dir of yours", state, filepath.Base(dbPath))
	}
	addr := cfg.HTTPAddr
	if addr == "" {
		if b, err := os.ReadFile(filepath.Join(state, addrFile)); err == nil {
			addr = strings.TrimSpace(string(b))
		}
	}
	if addr == "" {
		addr = "127.0.0.1:8080"
	}
	tok, err := newSecret("tk_")
	if err != nil {
		return err
	}
	db, err := controlstore.OpenSQLite(ctx, dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	err = db.CreateUser(ctx, controlstore.User{ID: cfg.Name, TokenHash: controlstore.HashUserToken(tok)}, grants...)
	if errors.Is(err, controlstore.ErrExists) {
		return fmt.Errorf("a user named %s exists already in %s: choose another name (its token is unchanged)", cfg.Name, state)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, `User %[1]s added, with access to %[2]s / %[3]s.

  Open in a browser:  http://%[4]s/#token=%[5]s
  User token:         %[5]s   (Authorization: Bearer <token>)

The token is shown only now (the database keeps its hash).
`, cfg.Name, cfg.Tenant, cfg.Env, addr, tok)
	return nil
}

// recordAddr writes the control plane's address into the state dir for
// AddUser.
func recordAddr(state, addr string) error {
	return atomicfile.WriteFile(filepath.Join(state, addrFile), []byte(addr+"\n"), 0o600)
}
