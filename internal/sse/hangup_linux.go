//go:build linux

package sse

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// hangups ends the context of a stream taken over from the HTTP server
// (Conn) when its reader hangs up, without a goroutine blocked in a read for each: one
// epoll set, separate from the Go runtime's, holds every such socket for
// EPOLLRDHUP (the peer closed its side), and one goroutine waits on it.
// An entry is keyed by a number never reused, not by the descriptor, and
// is removed before its socket is closed, so a descriptor number reused by
// a later socket is never mistaken for it.
type hangups struct {
	epfd int
	next atomic.Uint64

	mu    sync.Mutex
	conns map[uint64]context.CancelFunc // guarded by mu
}

var (
	watchOnce sync.Once
	watch     *hangups // nil when epoll is not available
)

func watcher() *hangups {
	watchOnce.Do(func() {
		fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return
		}
		watch = &hangups{epfd: fd, conns: map[uint64]context.CancelFunc{}}
		go watch.run()
	})
	return watch
}

func (h *hangups) run() {
	evs := make([]unix.EpollEvent, 256)
	for {
		n, err := unix.EpollWait(h.epfd, evs, -1)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return
		}
		h.mu.Lock()
		for _, ev := range evs[:n] {
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			if hungUp, ok := h.conns[id]; ok {
				delete(h.conns, id)
				hungUp()
			}
		}
		h.mu.Unlock()
	}
}

// add watches rc's socket, calling hungUp when the peer hangs up; it
// returns the entry's key, or ok false when it cannot be watched.
func (h *hangups) add(rc syscall.RawConn, hungUp context.CancelFunc) (id uint64, ok bool) {
	id = h.next.Add(1)
	h.mu.Lock()
	h.conns[id] = hungUp
	h.mu.Unlock()
	var err error
	cerr := rc.Control(func(fd uintptr) {
		ev := unix.EpollEvent{Events: unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(uint32(id)), Pad: int32(uint32(id >> 32))}
		err = unix.EpollCtl(h.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev)
	})
	if cerr != nil || err != nil {
		h.mu.Lock()
		delete(h.conns, id)
		h.mu.Unlock()
		return 0, false
	}
	return id, true
}

// remove stops watching rc's socket (before it is closed).
func (h *hangups) remove(id uint64, rc syscall.RawConn) {
	_ = rc.Control(func(fd uintptr) {
		_ = unix.EpollCtl(h.epfd, unix.EPOLL_CTL_DEL, int(fd), nil)
	})
	h.mu.Lock()
	delete(h.conns, id)
	h.mu.Unlock()
}

// watchHangup calls hungUp when c's peer hangs up, where c has a socket
// and epoll is there (otherwise never); stop must be called before c is
// closed.
func watchHangup(c any, hungUp context.CancelFunc) (stop func()) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return func() {}
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return func() {}
	}
	h := watcher()
	if h == nil {
		return func() {}
	}
	id, ok := h.add(rc, hungUp)
	if !ok {
		return func() {}
	}
	return func() { h.remove(id, rc) }
}
