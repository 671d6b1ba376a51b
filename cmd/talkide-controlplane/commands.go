package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/token"
)

const usage = `talkide-controlplane runs the TalkIDE control plane.

Usage:
  talkide-controlplane                      serve (configuration from the environment; see the README)
  talkide-controlplane new-master-key [-id ID]
                                            print a fresh TALKIDE_MASTER_KEYS entry (ID: key id, default k1;
                                            give a new id when rotating: TALKIDE_MASTER_KEYS=new,old)
  talkide-controlplane worker-credentials -tenant T -env E
                                            issue an identity token for T/E and print it with the worker's
                                            request key (the worker's two secrets)
  talkide-controlplane revoke-identity -jti ID
                                            revoke an identity token (its id is the token's "jti"); the mint
                                            refuses it from then on
  talkide-controlplane add-user -id U [-grant tenant/env,...] [-token T]
                                            create or update a browser user with the given grants and print
                                            its bearer token (generated unless -token is given)
  talkide-controlplane provision -tenant T -env E [-wait DURATION]
                                            make (or repair) T/E's worker in Kubernetes (namespace T-E) and
                                            print its status as JSON; waits until its objects exist, with
                                            -wait also until it is ready
  talkide-controlplane deprovision -tenant T -env E
                                            remove T/E's worker (its namespace with everything in it) and
                                            revoke its identity tokens
  talkide-controlplane status -tenant T -env E
                                            print T/E's worker status as the cluster shows it
  talkide-controlplane rotate-identity -tenant T -env E
                                            give T/E's worker a new identity token now (the old one stays
                                            valid for TALKIDE_IDENTITY_ROTATION_GRACE)
  talkide-controlplane clusterrole          print what an administrator installs for the provisioner: the
                                            control plane's ClusterRole and the admission policies that
                                            confine it and the workers' Jobs
  (the four commands above use KUBECONFIG, else in-cluster credentials, with the same
  TALKIDE_MASTER_KEYS and database settings as the server; docs/provisioning.md)
  talkide-controlplane help                 this text
`

// command runs a subcommand; handled reports whether args named one.
func command(ctx context.Context, args []string, out io.Writer, log *slog.Logger) (handled bool, err error) {
	if len(args) == 0 {
		return false, nil
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(out, usage)
		return true, nil
	case "new-master-key":
		fs := flag.NewFlagSet("new-master-key", flag.ContinueOnError)
		id := fs.String("id", "k1", "key id (letters, digits, - and _)")
		if err := fs.Parse(args[1:]); err != nil {
			return true, err
		}
		mk, err := token.NewMasterKey(*id)
		if err != nil {
			return true, err
		}
		if _, err := token.ParseMasterKey(mk.String()); err != nil {
			return true, err
		}
		fmt.Fprintln(out, mk.String())
		return true, nil
	case "worker-credentials":
		return true, workerCredentials(ctx, args[1:], out, log)
	case "revoke-identity":
		return true, revokeIdentity(ctx, args[1:], out, log)
	case "add-user":
		return true, addUser(ctx, args[1:], out, log)
	case "provision", "deprovision", "status", "rotate-identity":
		return true, provisionCommand(ctx, args[0], args[1:], out, log)
	case "clusterrole":
		return true, printClusterRole(out)
	}
	return true, fmt.Errorf("unknown command %q (see: talkide-controlplane help)", args[0])
}

func openDB(ctx context.Context, log *slog.Logger) (controlplane.Config, *controlstore.DB, error) {
	cfg, err := configFromEnv(log)
	if err != nil {
		return cfg, nil, err
	}
	db, err := controlplane.OpenDB(ctx, cfg)
	return cfg, db, err
}

func revokeIdentity(ctx context.Context, args []string, out io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet("revoke-identity", flag.ContinueOnError)
	jti := fs.String("jti", "", "the identity token's id (its jti claim)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *jti == "" {
		return errors.New("revoke-identity: -jti is required")
	}
	_, db, err := openDB(ctx, log)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.RevokeIdentityToken(ctx, *jti, time.Now()); err != nil {
		if errors.Is(err, controlstore.ErrNotFound) {
			return fmt.Errorf("revoke-identity: no unrevoked identity token %s", *jti)
		}
		return err
	}
	fmt.Fprintf(out, "revoked identity token %s\n", *jti)
	return nil
}

func addUser(ctx context.Context, args []string, out io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet("add-user", flag.ContinueOnError)
	id := fs.String("id", "", "user id")
	grants := fs.String("grant", "", "tenant/env pairs the user may use, comma-separated")
	tok := fs.String("token", "", "bearer token (default: a fresh random one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if strings.TrimSpace(*id) == "" {
		return errors.New("add-user: -id is required")
	}
	if !controlstore.ValidUserID(*id) {
		return fmt.Errorf("add-user: -id %q: want at most 128 bytes of UTF-8 without control characters or surrounding spaces", *id)
	}
	te, err := controlstore.ParseTenantEnvs(*grants)
	if err != nil {
		return fmt.Errorf("add-user: -grant: %w", err)
	}
	if *tok == "" {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		*tok = "tk_" + base64.RawURLEncoding.EncodeToString(b)
	}
	_, db, err := openDB(ctx, log)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.UpsertUser(ctx, controlstore.User{ID: *id, TokenHash: controlstore.HashUserToken(*tok)}, te...); err != nil {
		return err
	}
	fmt.Fprintf(out, "user %s: bearer token %s\n", *id, *tok)
	return nil
}
