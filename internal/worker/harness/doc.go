// Package harness is the worker's AnthropicAgentSdkHarness: it runs one
// Claude Code CLI process per active conversation over the stream-json
// protocol, exactly as the official Agent SDKs drive the CLI, and turns the
// CLI's output into the conversation's durable event stream.
//
// Each CLI process runs in its own process group, with an environment built
// from scratch (buildSDKEnv): ANTHROPIC_BASE_URL points at the worker's
// LocalGatewayProxyServer with the conversation id as path prefix,
// ANTHROPIC_AUTH_TOKEN is a per-process placeholder that only the local proxy
// accepts, ANTHROPIC_API_KEY and every TALKIDE_* variable are absent, and
// a CLAUDE_CONFIG_DIR, HOME and CLAUDE_CODE_TMPDIR of the conversation's own
// are set (as root, the process also runs as a user of the conversation's
// own: see Config.AgentUIDs). Ownership, crash recovery, the process cap and
// shutdown are in ownership.go; permission requests in permissions.go; the
// translation of tool calls, sub-agents' included, in toolcalls.go. A
// conversation's messages run one turn at a time; further messages wait in
// its queue. A second message continues the same CLI session; when the
// process is gone (idle timeout, stop, crash, worker restart) the next message
// resumes it from the transcript with --resume.
//
// Main type: Harness. It does not serve HTTP (package worker does) and does
// not decide where model calls go (package localproxy does).
package harness
