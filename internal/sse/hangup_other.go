//go:build !linux

package sse

// watchHangup has no watcher off Linux: a stream taken over learns that
// its reader left from a failed write (its heartbeat at the latest).
func watchHangup(c any) (gone <-chan struct{}, stop func()) { return nil, func() {} }
