// Package contract is the wire contract between the control plane (the "BE")
// and a worker: the commands the control plane sends to a worker, the event
// stream a worker sends back, the mint exchange, and the reporting calls.
// Both sides import it; docs/worker-api.md and docs/openapi.yaml describe the
// same contract for clients written in other languages, and a test keeps the
// OpenAPI document in step with these types.
//
// Main types: Event (one entry of a conversation's event stream, with its
// per-conversation sequence id), the per-type payloads (SessionStarted,
// AssistantText, ToolUse, ToolResult, APIRetry, TurnCompleted, TurnFailed,
// ErrorEvent, ...), the command bodies (CreateSessionRequest,
// SendMessageRequest, ...), and ErrorBody, the one JSON error shape of every
// non-gateway HTTP API of the platform.
//
// It holds types, paths and header names only: no HTTP clients, servers or
// storage.
package contract
