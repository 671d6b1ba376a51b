// Package devupstream is the development upstream: an Anthropic-compatible
// Messages API server that stands in for api.anthropic.com when no
// ANTHROPIC_API_KEY is set (`make run`) and in tests, where it is driven by
// the real Claude Code CLI. These machines cannot reach Anthropic, so this
// server must speak the real wire format: it accepts every request shape
// Claude Code 2.1.332 was observed to send (role "system" entries in
// messages, adaptive thinking, context_management, output_config,
// defer_loading tools, any anthropic-beta), and its answers follow
// "Anthropic Messages streaming events" and Anthropic's error envelope.
//
// # Endpoints
//
// The server is mounted at the root (a gateway in front strips its own
// prefix). The `?beta=true` query the CLI adds is accepted and ignored.
//
//	POST /v1/messages               streaming ("stream": true) and not
//	POST /v1/messages/count_tokens  {"input_tokens": N}
//	GET /v1/models                  the one model it answers as (ModelID)
//	GET|HEAD /api/hello             200 (the CLI's start-up pre-flight)
//	anything else                   404 not_found_error
//
// Every response, errors included, carries a `request-id: req_dev_…` header.
// Errors use Anthropic's envelope
// {"type":"error","error":{"type":…,"message":…},"request_id":"req_dev_…"}.
// Token counts are deterministic estimates: input = bytes of the raw
// messages+system+tools JSON / 4 (at least 1); output = bytes of the
// generated content / 4 (at least 1).
//
// # Main types
//
//   - [Server] is the [net/http.Handler]; build it with [New] from a [Config].
//   - [Responder] decides what to answer to a [Request]; [DemoResponder] is the
//     default (runs a command written between backticks through the Bash tool,
//     directly or through a sub-agent when the prompt asks for one, quotes
//     tool results, files issues, answers the session-title call).
//   - [Response] describes an answer: content blocks, or an HTTP error
//     ([APIError]), plus stream faults ([StreamError], [Cut]) and delays.
//   - [Server.Script] queues responses that are used first-in first-out
//     before the responder is asked; [Server.Requests] returns what was
//     received ([RecordedRequest]), credentials included, for assertions.
//
// # Admin API
//
// Only with [Config.EnableAdmin], for tests that run the server in another
// process. There is no authentication on these paths: enable them only on a
// loopback address.
//
//	POST /_dev/script    body: JSON array of responses, queued in order;
//	                     answers {"queued": N} (N = queue length afterwards)
//	GET  /_dev/requests  JSON array of recorded requests
//	POST /_dev/reset     empties the queue and the recorded requests; 204
//
// A scripted response (all fields optional, unknown fields rejected):
//
//	{
//	  "content": [
//	    {"type": "text", "text": "I'll run that."},
//	    {"type": "tool_use", "id": "toolu_x", "name": "Bash", "input": {"command": "ls"}},
//	    {"type": "thinking", "thinking": "…", "signature": "…"}
//	  ],
//	  "stop_reason": "tool_use",
//	  "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0,
//	            "cache_read_input_tokens": 0, "output_tokens": 5,
//	            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}},
//	  "error": {"status": 429, "type": "rate_limit_error", "message": "slow down",
//	            "headers": {"retry-after": "2"}, "details": {"error_code": "…"}},
//	  "stream_error": {"after_events": 1, "type": "overloaded_error", "message": "Overloaded"},
//	  "cut": {"after_events": 3},
//	  "first_byte_delay_ms": 0,
//	  "event_delay_ms": 0
//	}
//
// A recorded request:
//
//	{"method": "POST", "path": "/v1/messages", "query": "beta=true",
//	 "header": {"Authorization": ["Bearer …"], …}, "body": "<request body as text>"}
//
// # What it is not
//
// It is not a model and not a proxy: it never forwards anything, and its
// answers are canned. It does not validate requests beyond the fields every
// Messages call needs (model, messages, max_tokens), so that nothing the CLI
// sends is ever rejected.
package devupstream
