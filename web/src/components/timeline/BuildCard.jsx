import { duration } from "../../lib/format.js";

const LOG_TAIL = 30;

function buildState(item) {
  const c = item.completed;
  if (c) return { succeeded: "Succeeded", failed: "Failed", cancelled: "Cancelled" }[c.phase] || c.phase;
  if (item.state === "queued") return item.queuePlace ? `Queued (place ${item.queuePlace})` : "Queued";
  if (item.state === "running") return "Running";
  return "Starting";
}

// BuildCard is a build: its state, test results and log tail.
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
