// Command talkide runs the whole TalkIDE platform on one machine:
//
//	talkide run
//
// It starts the control plane (SQLite), one worker for tenant demo / env dev,
// and the development upstream unless ANTHROPIC_API_KEY is set, then prints
// where to go. See the README.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/talkide/talkide/internal/harden"
	"github.com/talkide/talkide/internal/localrun"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "talkide:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) != 1 || args[0] != "run" {
		return fmt.Errorf("usage: talkide run")
	}
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
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
}
