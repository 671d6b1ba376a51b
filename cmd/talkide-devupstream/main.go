// Command talkide-devupstream serves the development upstream, an
// Anthropic-compatible Messages API that stands in for api.anthropic.com
// when no ANTHROPIC_API_KEY is set (see internal/devupstream).
//
// Usage:
//
//	talkide-devupstream [-addr 127.0.0.1:8090] [-admin] [-no-auth] [-v]
//
// Environment:
//
//	TALKIDE_DEVUPSTREAM_ADDR     listen address (default 127.0.0.1:8090; -addr wins)
//	TALKIDE_DEVUPSTREAM_API_KEY  credential required on /v1/ calls; required unless -no-auth
//	TALKIDE_DEVUPSTREAM_ADMIN    "1" or "true" serves the /_dev/ admin API (like -admin)
//
// Without a key it refuses to start: anything on the host (an agent too)
// could otherwise call it directly, past the gateway and the budget. The
// control plane sends the key as its ANTHROPIC_API_KEY. -no-auth accepts
// any caller, for a machine where nothing untrusted runs.
//
// It prints "listening on http://<addr>" to stdout once it accepts
// connections (with port 0 this is the chosen port) and logs to stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/talkide/talkide/internal/devupstream"
)

// options is what flags and environment decide.
type options struct {
	addr   string
	apiKey string
	admin  bool
	noAuth bool
	debug  bool
}

func main() {
	opts, err := parseOptions(os.Args[1:], os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "talkide-devupstream:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "talkide-devupstream:", err)
		stop()
		os.Exit(1)
	}
}

func parseOptions(args []string, getenv func(string) string) (options, error) {
	opts := options{addr: getenv("TALKIDE_DEVUPSTREAM_ADDR"), apiKey: getenv("TALKIDE_DEVUPSTREAM_API_KEY")}
	if opts.addr == "" {
		opts.addr = "127.0.0.1:8090"
	}
	if v := getenv("TALKIDE_DEVUPSTREAM_ADMIN"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return options{}, fmt.Errorf("TALKIDE_DEVUPSTREAM_ADMIN=%q: want true or false", v)
		}
		opts.admin = b
	}
	fs := flag.NewFlagSet("talkide-devupstream", flag.ContinueOnError)
	fs.StringVar(&opts.addr, "addr", opts.addr, "listen address (env TALKIDE_DEVUPSTREAM_ADDR)")
	fs.BoolVar(&opts.admin, "admin", opts.admin, "serve the /_dev/ admin API (env TALKIDE_DEVUPSTREAM_ADMIN)")
	fs.BoolVar(&opts.noAuth, "no-auth", false, "accept /v1/ calls without the key (anyone on the host may then use it)")
	fs.BoolVar(&opts.debug, "v", false, "log at debug level")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if opts.apiKey == "" && !opts.noAuth {
		return options{}, errors.New("set TALKIDE_DEVUPSTREAM_API_KEY (the control plane's ANTHROPIC_API_KEY), or pass -no-auth to let any process on this host call it past the gateway and the budget")
	}
	if opts.apiKey != "" && opts.noAuth {
		return options{}, errors.New("-no-auth with TALKIDE_DEVUPSTREAM_API_KEY set: choose one")
	}
	return opts, nil
}

// run serves until ctx ends, then shuts down gracefully.
func run(ctx context.Context, opts options, stdout, stderr io.Writer) error {
	level := slog.LevelInfo
	if opts.debug {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	ln, err := net.Listen("tcp", opts.addr)
	if err != nil {
		return fmt.Errorf("listen on %s (set TALKIDE_DEVUPSTREAM_ADDR or -addr): %w", opts.addr, err)
	}
	srv := &http.Server{
		Handler: devupstream.New(devupstream.Config{
			APIKey:      opts.apiKey,
			Logger:      logger,
			EnableAdmin: opts.admin,
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		// No WriteTimeout and no ReadTimeout: answers are SSE streams that
		// can be slowed down on purpose (scripted delays), and either
		// deadline would cut a long stream (a ReadTimeout cancels the
		// request context once it passes). Bodies are bounded to 32 MB by
		// the handler; request contexts end with ctx.
		BaseContext: func(net.Listener) context.Context { return ctx },
		ErrorLog:    slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	logger.Info("listening", "addr", ln.Addr().String(), "admin", opts.admin, "auth", opts.apiKey != "")
	fmt.Fprintf(stdout, "listening on http://%s\n", ln.Addr())

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdownCtx)
	if serr := <-serveErr; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	logger.Info("stopped")
	return nil
}
