import { useState } from "preact/hooks";
import { fileEdits } from "../../lib/diff.js";
import { useNow } from "../../lib/hooks.js";
import { pretty, relPath, toolName } from "../../lib/tools.js";
import { Diff } from "../Diff.jsx";

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

// PermissionRequest is a request of the agent's to use a tool: Allow and
// Deny while it is pending, then how it was resolved.
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
