import { Component } from "preact";
import { useState } from "preact/hooks";
import { fileEdits } from "../lib/diff.js";
import { duration, oneLine, tokens, usdFromNano, usdString, visible } from "../lib/format.js";
import { turnCost, useBooked } from "../lib/booked.js";
import { useNow } from "../lib/hooks.js";
import { Diff } from "./Diff.jsx";
import { Markdown } from "./Markdown.jsx";

// ItemView renders one timeline item and re-renders only when the item
// changed (its `v`) or the shared context did.
export class ItemView extends Component {
  shouldComponentUpdate(next) {
    return next.item !== this.props.item || next.v !== this.props.v || next.ctx !== this.props.ctx;
  }

  render({ item, ctx }) {
    switch (item.kind) {
      case "user":
        return <UserMessage item={item} />;
      case "text":
        return (
          <div class="msg assistant" data-event-id={item.id}>
            <Markdown text={item.text} />
          </div>
        );
      case "tool":
        return <ToolCall item={item} ctx={ctx} />;
      case "perm":
        return <PermissionRequest item={item} ctx={ctx} />;
      case "build":
        return <BuildCard item={item} />;
      case "turn-end":
        return <TurnEnd item={item} ctx={ctx} />;
      case "failed":
        return <TurnFailed item={item} ctx={ctx} />;
      case "notice":
        return (
          <div class={"notice " + item.level} data-event-id={item.id} role={item.level === "error" ? "alert" : undefined}>
            {item.title && <strong>{item.title}: </strong>}
            {item.text}
          </div>
        );
      default:
        return null;
    }
  }
}

export function UserMessage({ item, state }) {
  // state: "sending" | "queued" | "failed" for messages not in the stream yet.
  const queued = item.queued || state === "queued" || state === "sending";
  return (
    <div class={"msg user" + (queued ? " is-queued" : "")} data-event-id={item.id || undefined} data-client-message-id={item.cmid}>
      <div class="bubble">{item.text}</div>
      {queued && (
        <div class="msg-state">
          <span class="badge">{state === "sending" ? "Sending…" : "Queued"}</span>
        </div>
      )}
    </div>
  );
}

// --- tool calls -------------------------------------------------------

// toolName splits an MCP tool's name ("mcp__server__tool").
export function toolName(name) {
  const m = /^mcp__(.+?)__(.+)$/.exec(name || "");
  return m ? { tool: m[2], server: m[1] } : { tool: name || "tool", server: "" };
}

// relPath shows a path inside the agent's working directory relative to it.
export function relPath(p, dir) {
  if (typeof p !== "string" || !dir) return p;
  const d = dir.replace(/\/+$/, "") + "/";
  return p.startsWith(d) ? p.slice(d.length) || "." : p;
}

export function shortInput(name, input, dir) {
  if (input === null || input === undefined) return "";
  if (typeof input !== "object") return String(input);
  const s = (v) => (typeof v === "string" ? v : "");
  switch (name) {
    case "Bash":
      return s(input.command);
    case "Read":
    case "Edit":
    case "MultiEdit":
    case "Write":
      return relPath(s(input.file_path), dir);
    case "NotebookEdit":
      return s(input.notebook_path);
    case "Glob":
    case "Grep":
      return s(input.pattern) + (input.path ? " in " + s(input.path) : "");
    case "WebFetch":
      return s(input.url);
    case "WebSearch":
      return s(input.query);
    case "Agent":
    case "Task":
      return s(input.description) || s(input.prompt);
    case "TodoWrite":
      return Array.isArray(input.todos) ? input.todos.length + " to-dos" : "";
    default:
      for (const v of Object.values(input)) if (typeof v === "string" && v) return v;
      for (const v of Object.values(input)) if (Array.isArray(v) && v.length && v.every((x) => typeof x === "string")) return v.join(" ");
      return JSON.stringify(input);
  }
}

function pretty(input) {
  if (input === null || input === undefined) return "";
  if (typeof input === "string") return input;
  try {
    return JSON.stringify(input, null, 2);
  } catch {
    return String(input);
  }
}

// Output longer than this is cut, with a button to show it all.
const OUTPUT_LINES = 200;
const OUTPUT_CHARS = 20000;

function Output({ text: raw, isError, id }) {
  const [all, setAll] = useState(false);
  const text = visible(raw);
  const lines = text.split("\n");
  const long = lines.length > OUTPUT_LINES || text.length > OUTPUT_CHARS;
  const shown = all || !long ? text : lines.slice(0, OUTPUT_LINES).join("\n").slice(0, OUTPUT_CHARS);
  return (
    <div class={"tool-out" + (isError ? " err" : "")} data-event-id={id}>
      <div class="section-label">{isError ? "Error" : "Output"}</div>
      {text === "" ? (
        <p class="muted small">(no output)</p>
      ) : (
        <pre class="code">
          <code>{shown}</code>
        </pre>
      )}
      {long && !all && (
        <button type="button" class="ghost small" onClick={() => setAll(true)}>
          Show all {lines.length} lines
        </button>
      )}
    </div>
  );
}

function ToolInput({ name, input, dir }) {
  const edits = fileEdits(name, input);
  if (edits) {
    return (
      <div class="tool-in">
        {edits.map((e, i) => (
          <Diff path={relPath(e.path, dir)} title={e.path} lines={e.lines} label={edits.length > 1 ? `edit ${i + 1} of ${edits.length}` : name === "Write" ? "new content" : ""} />
        ))}
      </div>
    );
  }
  if (name === "Bash" && input && typeof input.command === "string") {
    return (
      <div class="tool-in">
        {input.description && <p class="muted small">{input.description}</p>}
        <pre class="code">
          <code>
            <span class="prompt" aria-hidden="true">
              ${" "}
            </span>
            {visible(input.command)}
          </code>
        </pre>
      </div>
    );
  }
  if ((name === "Agent" || name === "Task") && input && typeof input.prompt === "string") {
    return (
      <div class="tool-in">
        <div class="section-label">Task for the subagent{input.subagent_type ? ` (${input.subagent_type})` : ""}</div>
        <div class="quote">
          <Markdown text={input.prompt} />
        </div>
      </div>
    );
  }
  return (
    <div class="tool-in">
      <div class="section-label">Input</div>
      <pre class="code">
        <code>{visible(pretty(input))}</code>
      </pre>
    </div>
  );
}

export function ToolCall({ item, ctx }) {
  const { tool, server } = toolName(item.name);
  const edits = ["Edit", "MultiEdit", "Write"].includes(item.name);
  const agent = item.name === "Agent" || item.name === "Task";
  const status = item.result
    ? item.result.interrupted
      ? "stopped"
      : item.result.isError
        ? "error"
        : "done"
    : item.stopped
      ? "stopped"
      : "running";
  const statusText = { error: "failed", done: "done", stopped: "stopped", running: "running" }[status];
  const dir = ctx && ctx.workDir;
  const arg = oneLine(shortInput(item.name, item.input, dir), 90);
  return (
    <details class={"tool " + status + (item.parent ? " nested" : "")} data-testid="tool-call" data-event-id={item.id} data-tool={item.name} open={edits || agent}>
      <summary>
        <span class={"dot " + status} aria-hidden="true" />
        <span class="tool-name">{tool}</span>
        {server && <span class="tool-server">{server}</span>}
        {arg && <span class="tool-arg">{arg}</span>}
        <span class="tool-status">{statusText}</span>
      </summary>
      <div class="tool-body">
        <ToolInput name={item.name} input={item.input} dir={dir} />
        {item.children.length > 0 && (
          <div class="subcalls" aria-label="Subagent tool calls" role="group">
            {item.children.map((c) => (
              <ItemView key={c.toolUseId} item={c} v={c.v} ctx={ctx} />
            ))}
          </div>
        )}
        {item.result ? (
          <Output text={String(item.result.content)} isError={item.result.isError} id={item.result.id} />
        ) : (
          <p class="muted small">{status === "stopped" ? "No result: the turn ended first." : "Running…"}</p>
        )}
      </div>
    </details>
  );
}

// --- permission requests ----------------------------------------------

function countdown(expiresAt, now) {
  const ms = new Date(expiresAt).getTime() - now;
  if (!Number.isFinite(ms)) return "";
  if (ms <= 0) return "expiring";
  const s = Math.ceil(ms / 1000);
  if (s < 60) return `${s} s left`;
  return `${Math.ceil(s / 60)} min left`;
}

function resolvedText(r) {
  const allowed = r.behavior === "allow";
  switch (r.reason) {
    case "timeout":
      return "Denied: nobody answered in time";
    case "turn_ended":
      return "Denied: the turn ended first";
    default:
      return allowed ? "Allowed" : "Denied";
  }
}

export function PermissionRequest({ item, ctx }) {
  const [reason, setReason] = useState("");
  const [busy, setBusy] = useState("");
  const [error, setError] = useState("");
  const [local, setLocal] = useState(null);
  const resolved = item.resolved || local;
  const pendingNow = !resolved;
  const now = useNow(pendingNow ? 5000 : 3600000);
  const edits = fileEdits(item.toolName, item.input);
  const { tool, server } = toolName(item.toolName);
  const id = "perm-" + item.requestId;

  const answer = async (behavior) => {
    if (busy) return;
    setBusy(behavior);
    setError("");
    try {
      await ctx.answer(item.requestId, behavior, behavior === "deny" ? reason.trim() : "");
      setLocal({ behavior, reason: "answered", message: behavior === "deny" ? reason.trim() : "" });
    } catch (e) {
      if (e.status === 409) setError("This request was already resolved.");
      else setError(e.message || "The answer did not reach the server; try again.");
    } finally {
      setBusy("");
    }
  };

  return (
    <section
      class={"perm" + (resolved ? " resolved " + (resolved.behavior === "allow" ? "allowed" : "denied") : " pending")}
      role="group"
      aria-label="Permission request"
      data-event-id={item.id}
      data-request-id={item.requestId}
    >
      <div class="perm-head">
        <span class="perm-icon" aria-hidden="true">
          ⚑
        </span>
        <span>
          {item.subagent ? "A subagent asks" : "The agent asks"} to use <strong class="tool-name">{tool}</strong>
          {server && <span class="tool-server">{server}</span>}
        </span>
        {pendingNow && item.expiresAt && <span class="perm-exp muted small">{countdown(item.expiresAt, now)}</span>}
      </div>
      {item.description && <p class="perm-desc">{item.description}</p>}
      {edits ? (
        edits.map((e) => <Diff path={relPath(e.path, ctx && ctx.workDir)} title={e.path} lines={e.lines} />)
      ) : (
        <pre class="code perm-input">
          <code>{item.toolName === "Bash" && item.input && item.input.command ? item.input.command : pretty(item.input)}</code>
        </pre>
      )}
      {item.reraised && pendingNow && <p class="muted small">Asked again after the worker restarted; your earlier answer, if any, did not arrive.</p>}
      {pendingNow ? (
        <div class="perm-actions">
          <label class="sr-only" for={id + "-reason"}>
            Reason (optional)
          </label>
          <input
            id={id + "-reason"}
            type="text"
            placeholder="Reason (optional), told to the agent on Deny"
            value={reason}
            maxLength={2000}
            onInput={(e) => setReason(e.currentTarget.value)}
            onKeyDown={(e) => {
              if (e.key === "Enter" && !e.isComposing) {
                e.preventDefault();
                answer("deny");
              }
            }}
          />
          <button type="button" class="primary" disabled={!!busy} onClick={() => answer("allow")}>
            Allow
          </button>
          <button type="button" class="danger" disabled={!!busy} onClick={() => answer("deny")}>
            Deny
          </button>
        </div>
      ) : (
        <p class="perm-result">
          <span class={"badge " + (resolved.behavior === "allow" ? "ok" : "bad")}>{resolvedText(resolved)}</span>
          {resolved.message ? <span class="muted small"> “{resolved.message}”</span> : null}
        </p>
      )}
      {error && (
        <p class="form-error small" role="alert">
          {error}
        </p>
      )}
    </section>
  );
}

// --- builds -----------------------------------------------------------

const LOG_TAIL = 30;

function buildState(item) {
  const c = item.completed;
  if (c) return { succeeded: "Succeeded", failed: "Failed", cancelled: "Cancelled" }[c.phase] || c.phase;
  if (item.state === "queued") return item.queuePlace ? `Queued (place ${item.queuePlace})` : "Queued";
  if (item.state === "running") return "Running";
  return "Starting";
}

export function BuildCard({ item }) {
  const c = item.completed;
  const state = buildState(item);
  const tone = c ? (c.phase === "succeeded" ? "ok" : c.phase === "failed" ? "bad" : "") : "run";
  const tail = (c && c.log_tail && c.log_tail.length ? c.log_tail : item.lines).slice(-LOG_TAIL);
  const what = [item.tasks && item.tasks.length ? item.tasks.join(" ") : "", item.tests ? "tests " + item.tests : ""].filter(Boolean).join(" · ");
  return (
    <section class={"build " + tone} data-testid="build" data-event-id={item.id} aria-label="Build">
      <div class="build-head">
        <span class="build-title">
          Build{what ? <span class="muted"> · {what}</span> : null}
        </span>
        <span class={"badge " + tone} data-testid="build-state">
          {state}
        </span>
      </div>
      {c && (
        <p class="build-summary">
          {c.tests > 0 ? (
            <span>
              {c.tests} test{c.tests === 1 ? "" : "s"}
              {c.failures + c.errors > 0 ? <strong class="bad-text">, {c.failures + c.errors} failed</strong> : ", all passed"}
              {c.skipped ? `, ${c.skipped} skipped` : ""}
            </span>
          ) : (
            <span class="muted">No test results</span>
          )}
          <span class="muted">
            {" "}
            · {duration(c.duration_ms)}
            {c.exit_code >= 0 ? ` · exit ${c.exit_code}` : ""}
            {c.reason && c.phase !== "succeeded" ? ` · ${c.reason}` : ""}
          </span>
        </p>
      )}
      {c && c.message && c.phase !== "succeeded" && <p class="small">{c.message}</p>}
      {c && c.failed && c.failed.length > 0 && (
        <ul class="failed-tests" aria-label="Failed tests">
          {c.failed.map((f) => (
            <li>
              <code>
                {f.class ? f.class + "." : ""}
                {f.name}
              </code>
              {f.status === "error" ? <span class="muted small"> (error)</span> : null}
              {f.message && <div class="small fail-msg">{(f.type && !f.message.startsWith(f.type) ? f.type + ": " : "") + f.message}</div>}
            </li>
          ))}
        </ul>
      )}
      <details class="build-log-wrap" open={!c || c.phase !== "succeeded"}>
        <summary>
          Log{tail.length ? ` (last ${tail.length} line${tail.length === 1 ? "" : "s"})` : ""}
          {item.truncated ? " · earlier lines cut" : ""}
        </summary>
        <pre class="code build-log" data-testid="build-log">
          <code>{tail.length ? tail.join("\n") : c ? "(no log)" : "waiting for output…"}</code>
        </pre>
      </details>
    </section>
  );
}

// --- turn ends --------------------------------------------------------

export function TurnEnd({ item, ctx }) {
  const u = item.usage || {};
  const input = (u.input_tokens || 0) + (u.cache_creation_input_tokens || 0) + (u.cache_read_input_tokens || 0);
  const cost = turnCost(item, useBooked(ctx && ctx.conv, item.requestIds));
  return (
    <div class="turn-end" data-event-id={item.id} role="note" aria-label="Turn completed">
      <span class="rule" aria-hidden="true" />
      <span class="turn-info">
        <span class="turn-cost" data-testid="turn-cost" data-booked={cost.booked ? "true" : undefined} title={cost.title}>
          {cost.label}
        </span>
        <span title={`${input} input tokens (${u.cache_read_input_tokens || 0} from cache), ${u.output_tokens || 0} output tokens`}>
          {tokens(input)} in · {tokens(u.output_tokens)} out
        </span>
        <span>{duration(item.durationMs)}</span>
      </span>
      <span class="rule" aria-hidden="true" />
    </div>
  );
}

const FAIL_TEXT = {
  worker_restarted: "The worker restarted during this turn, which was not run again. Send your message again to go on.",
  process_exited: "The agent's process ended before the turn finished.",
  start_failed: "The agent could not be started.",
  max_turns: "The turn reached its limit of model calls.",
  execution_error: "The agent failed while working.",
  api_error: "The model call failed.",
};

export function TurnFailed({ item, ctx }) {
  if (item.reason === "interrupted") {
    return (
      <div class="turn-end interrupted" data-event-id={item.id}>
        <span class="rule" aria-hidden="true" />
        <span class="turn-info">
          <strong>Interrupted</strong>
          <span class="muted">you stopped this turn</span>
        </span>
        <span class="rule" aria-hidden="true" />
      </div>
    );
  }
  if (item.budget) {
    const b = ctx && ctx.budget;
    return (
      <div class="alert budget" role="alert" data-event-id={item.id}>
        <strong>Budget exhausted</strong>
        <p>
          The gateway refused the model call because what is left of your budget this period cannot cover what the call
          could cost at most (it holds that much while the call runs), so the turn stopped.
        </p>
        {b ? (
          <p>
            Your budget now: <strong>{usdString(b.remaining_usd)}</strong> left of {usdString(b.limit_usd)} this period
            {b.resets_at ? `, which ends on ${new Date(b.resets_at).toLocaleDateString(undefined, { day: "numeric", month: "long" })}` : ""}.
            {Number(b.remaining_usd) < 0.01 ? " Ask your administrator to raise the limit." : " You can go on."}
          </p>
        ) : null}
        <details>
          <summary>Details</summary>
          <p class="small">{item.message}</p>
        </details>
      </div>
    );
  }
  return (
    <div class="alert" role="alert" data-event-id={item.id}>
      <strong>The turn failed</strong>
      <p>{FAIL_TEXT[item.reason] || "The turn ended with an error."}</p>
      {item.message && <p class="small fail-msg">{item.message}</p>}
      {ctx && ctx.resend && item.text && (
        <button type="button" class="small" onClick={() => ctx.resend(item.text)}>
          Send again
        </button>
      )}
    </div>
  );
}
