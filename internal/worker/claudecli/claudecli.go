// Package claudecli knows where the pinned Claude Code CLI lives and which
// version it must be. The version is written once, in version.txt beside this
// file; the Makefile reads the same file to install the npm package
// @anthropic-ai/claude-code into the project-local .tools/ folder.
//
// It does not run sessions (see package harness) or parse the CLI's output
// (see package streamjson).
package claudecli

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

//go:embed version.txt
var versionFile string

// PinnedVersion is the Claude Code CLI version the platform is built and
// tested against, e.g. "2.1.332".
var PinnedVersion = strings.TrimSpace(versionFile)

// EnvBinary names the environment variable that overrides the CLI path.
const EnvBinary = "TALKIDE_CLAUDE_BIN"

// relBinary is where `make tools` installs the CLI, relative to the module root.
const relBinary = ".tools/claude-code/node_modules/.bin/claude"

// ErrNotFound is returned by Find when no CLI binary is found.
var ErrNotFound = errors.New("claude code CLI not found")

// Find returns the CLI binary path: $TALKIDE_CLAUDE_BIN if set, else the
// project-local install found by walking up from the working directory to the
// module root, else "claude" on PATH. It returns ErrNotFound (wrapped, with a
// hint) when none exists.
func Find() (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: %s=%s: %v", ErrNotFound, EnvBinary, p, err)
		}
		return p, nil
	}
	if dir, err := os.Getwd(); err == nil {
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				p := filepath.Join(dir, relBinary)
				if _, err := os.Stat(p); err == nil {
					return p, nil
				}
				break
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	if p, err := exec.LookPath("claude"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%w: run `make tools` (installs @anthropic-ai/claude-code@%s into %s) or set %s", ErrNotFound, PinnedVersion, relBinary, EnvBinary)
}

// Version runs `<bin> --version` and returns the version it prints
// (e.g. "2.1.332" from "2.1.332 (Claude Code)").
func Version(ctx context.Context, bin string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("run %s --version: %w", bin, err)
	}
	v, _, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	return v, nil
}

// CheckVersion returns an error when bin is not PinnedVersion.
func CheckVersion(ctx context.Context, bin string) error {
	v, err := Version(ctx, bin)
	if err != nil {
		return err
	}
	if v != PinnedVersion {
		return fmt.Errorf("claude code CLI %s is version %s, want %s (run `make tools`)", bin, v, PinnedVersion)
	}
	return nil
}
