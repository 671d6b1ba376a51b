// Package harden protects a platform process's secrets from other processes
// of the same user on the machine: Process makes the calling process
// non-dumpable, so an agent (or any process without CAP_SYS_PTRACE) cannot
// read its /proc/<pid>/environ, memory or file descriptors, and a crash
// writes no core dump holding the master key, the API key or an identity
// token.
//
// Every binary calls it first thing. It is its own package, not part of
// package sandbox (which confines the agents a worker runs), so that the
// control plane can harden itself without linking the worker's sandbox.
package harden

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Process makes the calling process non-dumpable (prctl PR_SET_DUMPABLE 0):
// no core dumps, and its /proc entries (environ, mem, fds) are closed to
// every process without CAP_SYS_PTRACE, the agent included.
func Process() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("make process non-dumpable: %w", err)
	}
	return nil
}
