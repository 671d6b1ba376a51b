package localproxy

import "time"

// SetClock makes id read the time from now, so tests decide when
// IdentityRecheck has passed and when a token has expired. It counts the
// file as looked at now.
func SetClock(id *Identity, now func() time.Time) {
	id.mu.Lock()
	defer id.mu.Unlock()
	id.now = now
	id.checked = now()
}
