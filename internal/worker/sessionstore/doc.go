// Package sessionstore is the worker's SessionStore: the durable state of
// every conversation on the session volume (an NFS ReadWriteMany volume in
// production, a local folder on one machine).
//
// Per conversation it keeps, under <root>/conversations/<id>/:
//
//   - state.json: Meta (CLI session id, working directory, user, accepted
//     client message ids, ...), written atomically (temp file, fsync, rename,
//     fsync of the directory), with an on-disk format version that unknown
//     readers reject;
//   - events.jsonl: the EventLog, an append-only, fsynced log of
//     contract.Event with per-conversation sequence ids. A torn last record
//     (a crash mid-append) is cut off and reported on open, never fatal.
//
// Readers of an EventLog never block writers: they read at their own pace from
// memory or the file and are woken by a broadcast channel on each append, so a
// slow subscriber cannot slow the others and resumes from the log.
//
// It relies on no file locks (NFS does not honour them reliably); single
// ownership of a conversation is the caller's job. It does not run processes.
package sessionstore
