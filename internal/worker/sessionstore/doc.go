// Package sessionstore is the worker's SessionStore: the durable state of
// every conversation on the session volume (an NFS ReadWriteMany volume in
// production, a local folder on one machine).
//
// Per conversation it keeps, under <root>/conversations/<id>/:
//
//   - state.0.json and state.1.json: Meta (CLI session id, working
//     directory, user, accepted client message ids, ...), each save written
//     in place into the slot not holding the newest intact state, checked
//     by a CRC-32C, so a save cut by a crash reads as the save before it;
//     state.json marks the conversation as existing and names the on-disk
//     format, which unknown readers reject (state.go);
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
