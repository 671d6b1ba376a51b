// Package reporting is the control plane's side of worker reporting: the
// endpoints under /api/internal/worker/* through which a worker reports
// tool calls, turn usage and its activity log, and files, reads, updates
// and comments the issues of its tenant-env (the talkide-issue-tracking MCP
// server's calls), and the Store that keeps them in the control-plane
// database.
//
// Every call is authenticated with a WorkerToken of one conversation
// (minted by the worker with its identity token): tenant, env,
// conversation and user come from the token only, so a worker cannot write
// into or read from another tenant-env. Every write carries an idempotency
// key; the Store applies a write and records its receipt (with the answer)
// in one transaction, so a retried write is stored once and answered like
// the first time.
//
// Main types: Handler (the worker endpoints; package controlplane registers
// them and the browser routes) and Store. It does not send reports (the
// worker's package outbox does) and does not authenticate browser users.
package reporting
