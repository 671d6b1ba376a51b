//go:build !linux

package sse

import "context"

// watchHangup has no watcher off Linux: a stream taken over learns that
// its reader left from a failed write (its heartbeat at the latest).
func watchHangup(c any, hungUp context.CancelFunc) (stop func()) { return func() {} }
