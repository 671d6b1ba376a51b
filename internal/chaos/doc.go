// Package chaos holds the crash test of the worker: scripted multi-turn
// conversations run through the real control plane, a real worker process
// and the real Claude Code CLI while the worker process is killed with
// SIGKILL at random moments, and the test checks that the browser streams
// lost and duplicated nothing, that no conversation is stuck, that every
// conversation goes on with its history, and that no process is orphaned.
//
// `go test ./internal/chaos` runs it with 20 kills (part of `make test`);
// `make chaos KILLS=200` runs it longer. It ends with one summary line:
//
//	chaos kills=20 turns=… lost_events=0 duplicate_events=0 stuck=0 orphans=0 resumed=…
package chaos
