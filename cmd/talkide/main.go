// Command talkide runs the whole TalkIDE platform on one machine:
//
//	talkide run
//	talkide user add [-tenant T] [-env E] NAME
//
// run starts the control plane (SQLite), one worker for tenant demo / env
// dev, and the development upstream unless ANTHROPIC_API_KEY is set, then
// prints where to go. user add gives one more person a token for that run,
// while it runs or not. See the README.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/talkide/talkide/internal/harden"
	"github.com/talkide/talkide/internal/localrun"
)

const usage = `usage:
  talkide run                                  the whole platform on this machine (make run)
  talkide user add [-tenant T] [-env E] NAME   a new user of that run, with a fresh token and
                                               access to T/E (default demo/dev); prints the URL
                                               that signs them in. Works while the run runs.
Both read TALKIDE_STATE_DIR (default .talkide) and TALKIDE_HTTP_ADDR.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "talkide:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	switch {
	case len(args) == 1 && args[0] == "run":
		return runPlatform(ctx, stdout, stderr)
	case len(args) >= 2 && args[0] == "user" && args[1] == "add":
		return addUser(ctx, args[2:], stdout, stderr)
	case len(args) == 1 && (args[0] == "help" || args[0] == "-h" || args[0] == "--help"):
		fmt.Fprint(stdout, usage)
		return nil
	}
	return errors.New(strings.TrimSuffix(usage, "\n"))
}

func runPlatform(ctx context.Context, stdout, stderr io.Writer) error {
	if err := harden.Process(); err != nil {
		return err
	}
	// Every TALKIDE_* setting of the user reaches the control plane and the
	// worker (the launcher's own ones are handled here).
	var extra []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case !strings.HasPrefix(name, "TALKIDE_"):
		case name == "TALKIDE_STATE_DIR", name == "TALKIDE_HTTP_ADDR", name == "TALKIDE_DEV_USER_TOKEN":
		default:
			extra = append(extra, kv)
		}
	}
	return localrun.Run(ctx, localrun.Config{
		StateDir:     os.Getenv("TALKIDE_STATE_DIR"),
		HTTPAddr:     os.Getenv("TALKIDE_HTTP_ADDR"),
		APIKey:       os.Getenv("ANTHROPIC_API_KEY"),
		UpstreamURL:  strings.TrimRight(os.Getenv("ANTHROPIC_BASE_URL"), "/"),
		DevUserToken: os.Getenv("TALKIDE_DEV_USER_TOKEN"),
		ExtraEnv:     extra,
		Out:          stdout,
		Logger:       slog.New(slog.NewTextHandler(stderr, nil)),
	})
}

// addUser parses `user add` arguments; the name may come before or after
// the flags.
func addUser(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("talkide user add", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tenant := fs.String("tenant", "demo", "the tenant the user may use")
	env := fs.String("env", "dev", "the environment of that tenant the user may use")
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	rest := fs.Args()
	if name == "" && len(rest) > 0 {
		name, rest = rest[0], rest[1:]
	}
	if name == "" || len(rest) > 0 {
		return errors.New("usage: talkide user add [-tenant T] [-env E] NAME")
	}
	return localrun.AddUser(ctx, localrun.UserConfig{
		StateDir: os.Getenv("TALKIDE_STATE_DIR"),
		HTTPAddr: os.Getenv("TALKIDE_HTTP_ADDR"),
		Name:     name,
		Tenant:   *tenant,
		Env:      *env,
		Out:      stdout,
	})
}
