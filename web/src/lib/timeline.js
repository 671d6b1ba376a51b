// The conversation as the page shows it, built from the event stream.
//
// A Timeline is mutable: apply() changes it in place and bumps `v` on every
// item it touches (and on the items that contain it), so views re-render
// only what changed. Events are applied once each, in id order: apply()
// ignores an event whose id is not above the last one applied, which is
// what makes a resumed stream free of duplicates.

export function newTimeline() {
  return {
    lastId: 0,
    items: [], // top-level items, in order
    tools: new Map(), // tool_use_id -> tool item (nested ones too)
    open: new Set(), // tool items without a result yet
    perms: new Map(), // request_id -> permission item
    builds: new Map(), // build_id -> build item
    users: new Map(), // client_message_id -> user item
    queue: [], // user items whose turn has not started, in order
    started: new Set(), // client_message_ids whose turn started or ended
    running: null, // client_message_id of the running turn, or null
    waiting: null, // turn_queued data while the turn waits for a process
    retry: null, // the newest api_retry of the running turn, until it goes on
    firstUserText: "",
    lastTurnEnd: 0, // id of the newest turn_completed/turn_failed
    v: 0,
  };
}

function touch(item) {
  for (let it = item; it; it = it.parent) it.v = (it.v || 0) + 1;
}

function add(tl, item) {
  item.v = 1;
  tl.items.push(item);
  return item;
}

// BUDGET_RE recognises the gateway's budget refusal ("TalkIDE budget
// exhausted: …", error_code budget_exceeded).
const BUDGET_RE = /budget/i;

export function isBudgetRefusal(d) {
  if (!d) return false;
  const msg = String(d.message || "");
  return BUDGET_RE.test(msg) && (d.api_error_status === 429 || /exhaust|exceed|limit|refus/i.test(msg));
}

// apply adds one event ({id, type, time, data}) to tl; it reports whether
// the event was new.
export function apply(tl, ev) {
  if (!ev || typeof ev.id !== "number" || ev.id <= tl.lastId) return false;
  tl.lastId = ev.id;
  tl.v++;
  const d = ev.data || {};
  const base = { id: ev.id, time: ev.time };
  switch (ev.type) {
    case "user_message": {
      // A message waits below the running turn until its own turn starts;
      // then it moves into the timeline, where its turn's output follows.
      const it = { ...base, kind: "user", cmid: d.client_message_id, text: d.text || "", queued: true, v: 1 };
      if (tl.started.has(d.client_message_id)) {
        it.queued = false;
        tl.items.push(it);
      } else tl.queue.push(it);
      if (d.client_message_id) tl.users.set(d.client_message_id, it);
      if (!tl.firstUserText) tl.firstUserText = d.text || "";
      break;
    }
    case "turn_queued":
      tl.waiting = d;
      break;
    case "turn_started": {
      tl.started.add(d.client_message_id);
      tl.running = d.client_message_id || "?";
      tl.waiting = null;
      tl.retry = null;
      dequeue(tl, d.client_message_id);
      if (d.continued) add(tl, { ...base, kind: "notice", level: "info", text: "The turn goes on after a worker restart." });
      break;
    }
    case "assistant_text": {
      tl.retry = null;
      add(tl, { ...base, kind: "text", text: d.text || "" });
      break;
    }
    case "tool_use": {
      tl.retry = null;
      const it = { ...base, kind: "tool", toolUseId: d.tool_use_id, name: d.name || "tool", input: d.input, result: null, children: [], v: 1 };
      const parent = d.parent_tool_use_id ? tl.tools.get(d.parent_tool_use_id) : null;
      if (parent) {
        it.parent = parent;
        parent.children.push(it);
        touch(parent);
      } else {
        tl.items.push(it);
      }
      if (d.tool_use_id) tl.tools.set(d.tool_use_id, it);
      tl.open.add(it);
      break;
    }
    case "tool_result": {
      tl.retry = null;
      // Claude Code ends a call cut by an interrupt with an error result
      // saying so (2.1.332: "… this call was stopped while running …"):
      // the call was stopped, it did not fail.
      const interrupted = !!d.is_error && /interrupted by user|was stopped while running/i.test(d.content || "");
      const it = tl.tools.get(d.tool_use_id);
      if (it) {
        it.result = { id: ev.id, content: d.content ?? "", isError: !!d.is_error, interrupted };
        tl.open.delete(it);
        touch(it);
      } else {
        add(tl, { ...base, kind: "tool", toolUseId: d.tool_use_id, name: "tool", input: null, children: [], result: { id: ev.id, content: d.content ?? "", isError: !!d.is_error, interrupted } });
      }
      break;
    }
    case "api_retry":
      tl.retry = { ...d, at: Date.now() };
      break;
    case "turn_completed":
    case "turn_failed": {
      const cmid = d.client_message_id;
      tl.started.add(cmid);
      dequeue(tl, cmid);
      if (tl.running === cmid || tl.running === "?") tl.running = null;
      tl.waiting = null;
      tl.retry = null;
      tl.lastTurnEnd = ev.id;
      // Calls the turn left without a result will not get one.
      for (const t of tl.open) {
        t.stopped = true;
        touch(t);
      }
      tl.open.clear();
      // A turn's pending permission requests end with it.
      if (ev.type === "turn_completed") {
        add(tl, {
          ...base,
          kind: "turn-end",
          cmid,
          usage: d.usage || {},
          cost: d.cost_nano_usd || 0,
          durationMs: d.duration_ms || 0,
          numTurns: d.num_turns || 0,
          requestIds: d.request_ids || [],
        });
      } else {
        add(tl, {
          ...base,
          kind: "failed",
          cmid,
          reason: d.reason || "",
          message: d.message || "",
          status: d.api_error_status || 0,
          text: (tl.users.get(cmid) || {}).text || "",
          budget: isBudgetRefusal(d),
          usage: d.usage || {},
          requestIds: d.request_ids || [],
        });
      }
      break;
    }
    case "error":
      add(tl, { ...base, kind: "notice", level: "error", text: d.message || d.code || "error" });
      break;
    case "permission_requested": {
      tl.retry = null;
      const old = tl.perms.get(d.request_id);
      if (old) {
        // Raised again (after a worker restart): the same request, updated.
        old.expiresAt = d.expires_at;
        old.reraised = true;
        old.input = d.input ?? old.input;
        if (old.resolved && old.resolved.local) old.resolved = null;
        touch(old);
        break;
      }
      const it = add(tl, {
        ...base,
        kind: "perm",
        requestId: d.request_id,
        toolName: d.tool_name || "tool",
        toolUseId: d.tool_use_id,
        input: d.input,
        description: d.description || "",
        expiresAt: d.expires_at,
        reraised: !!d.reraised,
        resolved: null,
      });
      const tool = tl.tools.get(d.tool_use_id);
      if (tool && tool.parent) it.subagent = true;
      tl.perms.set(d.request_id, it);
      break;
    }
    case "permission_resolved": {
      const it = tl.perms.get(d.request_id);
      if (it) {
        it.resolved = { behavior: d.behavior, reason: d.reason };
        touch(it);
      }
      break;
    }
    case "mcp_server_refused":
      add(tl, { ...base, kind: "notice", level: "warn", text: `MCP server “${d.server}” was not started${d.transport ? ` (${d.transport})` : ""}: ${d.reason}` });
      break;
    case "limit_reached":
      add(tl, { ...base, kind: "notice", level: "warn", text: d.message || `The agent reached its ${d.limit} limit.`, title: `${cap(d.limit || "resource")} limit reached` });
      break;
    case "build_started": {
      const it = tl.builds.get(d.build_id);
      if (it) {
        it.runner = d.runner;
        it.tasks = d.tasks || [];
        touch(it);
        break;
      }
      tl.builds.set(d.build_id, add(tl, { ...base, kind: "build", buildId: d.build_id, runner: d.runner, tasks: d.tasks || [], tests: d.tests || "", state: "starting", queuePlace: 0, lines: [], truncated: false, completed: null }));
      break;
    }
    case "build_progress": {
      let it = tl.builds.get(d.build_id);
      if (!it) {
        it = add(tl, { ...base, kind: "build", buildId: d.build_id, runner: "", tasks: [], tests: "", state: "starting", queuePlace: 0, lines: [], truncated: false, completed: null });
        tl.builds.set(d.build_id, it);
      }
      if (d.state) it.state = d.state;
      it.queuePlace = d.state === "queued" ? d.queue_place || 0 : d.state ? 0 : it.queuePlace;
      if (d.pod_phase) it.podPhase = d.pod_phase;
      if (d.lines && d.lines.length) {
        it.lines = it.lines.concat(d.lines);
        if (it.lines.length > MAX_BUILD_LINES) it.lines = it.lines.slice(-MAX_BUILD_LINES);
      }
      if (d.truncated) it.truncated = true;
      touch(it);
      break;
    }
    case "build_completed": {
      let it = tl.builds.get(d.build_id);
      if (!it) {
        it = add(tl, { ...base, kind: "build", buildId: d.build_id, runner: d.runner, tasks: [], tests: "", state: "", queuePlace: 0, lines: [], truncated: false, completed: null });
        tl.builds.set(d.build_id, it);
      }
      it.completed = d;
      it.state = d.phase;
      it.queuePlace = 0;
      touch(it);
      break;
    }
    case "session_started":
      tl.model = d.model;
      if (d.work_dir) tl.workDir = d.work_dir;
      break;
    case "session_stopped":
      // Quiet: the agent's process ends when idle or evicted; the next
      // message starts it again.
      break;
    default:
      break;
  }
  return true;
}

// dequeue moves the queued message cmid into the timeline.
function dequeue(tl, cmid) {
  const i = tl.queue.findIndex((u) => u.cmid === cmid);
  if (i < 0) return;
  const [u] = tl.queue.splice(i, 1);
  u.queued = false;
  touch(u);
  tl.items.push(u);
}

// MAX_BUILD_LINES bounds the log lines a build card keeps (it shows fewer).
const MAX_BUILD_LINES = 200;

function cap(s) {
  return s ? s[0].toUpperCase() + s.slice(1) : s;
}

// pendingPermissions counts the requests nobody answered yet.
export function pendingPermissions(tl) {
  let n = 0;
  for (const p of tl.perms.values()) if (!p.resolved) n++;
  return n;
}
