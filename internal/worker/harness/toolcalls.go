package harness

import (
	"encoding/json"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/streamjson"
)

// This file turns the tool calls on the CLI's stdout into tool_use and
// tool_result events, the calls of sub-agents included.
//
// A sub-agent is started by the main agent's Agent tool (system/init lists
// it as "Task"). What CLI 2.1.332 prints for one (docs/worker-api.md §5.5):
// system/task_started {task_id, tool_use_id: the Agent call}, then the
// sub-agent's own assistant and user lines with parent_tool_use_id = the
// Agent call and agent_id = task_id, then task_notification and the Agent
// call's tool_result on a main-agent line. A can_use_tool request of a
// sub-agent's call names the call (tool_use_id) and the agent (agent_id),
// not the parent call.
//
// The CLI was seen to print a call's assistant line before asking
// permission for it, but nothing promises that order. So a call is
// announced (its tool_use event emitted) at whichever comes first, the
// assistant line or the permission request, and only once: the client has
// always seen the tool_use a permission_requested event refers to.

// maxOpenCalls bounds the calls remembered as announced but unfinished.
// Every call gets a result line (a refused or interrupted call an error
// result) and a new process starts afresh, so only calls in flight stay;
// the bound guards against a CLI that never sends some results.
const maxOpenCalls = 4096

// toolCalls is what the stdout of one CLI process has shown of tool calls
// and sub-agents. The zero value is ready; a session keeps one per process
// (reset when the process is gone), guarded by the session's mu.
type toolCalls struct {
	// open holds the ids of calls whose tool_use event was emitted and
	// whose tool_result was not yet seen.
	open map[string]bool
	// agents maps a running sub-agent's id (agent_id, task_id) to the
	// tool_use id of the Agent call that started it.
	agents map[string]string
}

// use returns the tool_use event of a call and true, or false when the
// call was already announced. parent is the Agent call the call was made
// under ("" for the main agent's calls or when unknown); agentID, when parent
// is empty, finds it among the running sub-agents.
func (c *toolCalls) use(id, name string, input json.RawMessage, parent, agentID string) (contract.ToolUse, bool) {
	if c.open[id] {
		return contract.ToolUse{}, false
	}
	if c.open == nil || len(c.open) >= maxOpenCalls {
		c.open = map[string]bool{}
	}
	if id != "" {
		c.open[id] = true
	}
	if parent == "" && agentID != "" {
		parent = c.agents[agentID]
	}
	if len(input) == 0 {
		input = json.RawMessage("{}")
	}
	return contract.ToolUse{ToolUseID: id, Name: name, Input: input, ParentToolUseID: parent}, true
}

// result returns the tool_result event of a call and forgets the call.
func (c *toolCalls) result(b streamjson.ContentBlock, parent string) contract.ToolResult {
	delete(c.open, b.ToolUseID)
	return contract.ToolResult{ToolUseID: b.ToolUseID, Content: b.ResultText(), IsError: b.IsError, ParentToolUseID: parent}
}

// agentStarted records that sub-agent agentID runs under the Agent call
// parent.
func (c *toolCalls) agentStarted(agentID, parent string) {
	if agentID == "" || parent == "" {
		return
	}
	if c.agents == nil {
		c.agents = map[string]string{}
	}
	c.agents[agentID] = parent
}

// agentEnded forgets a sub-agent that finished.
func (c *toolCalls) agentEnded(agentID string) { delete(c.agents, agentID) }

// asked returns the tool_use event of the call a can_use_tool request asks
// about when no event announced it yet; ok is false when one did (or the
// request names no call).
func (c *toolCalls) asked(m *streamjson.ControlRequest) (contract.ToolUse, bool) {
	var req struct {
		ToolName  string          `json:"tool_name"`
		Input     json.RawMessage `json:"input"`
		ToolUseID string          `json:"tool_use_id"`
		AgentID   string          `json:"agent_id"`
	}
	if json.Unmarshal(m.Request, &req) != nil || req.ToolUseID == "" {
		return contract.ToolUse{}, false
	}
	return c.use(req.ToolUseID, req.ToolName, req.Input, "", req.AgentID)
}

// parentOf returns the Agent call a stdout line belongs to, "" for the main
// agent's lines.
func parentOf(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
