import { duration } from "../../lib/format.js";
import { useNow } from "../../lib/hooks.js";

// Working: the running turn's state, at the end of the timeline.
export function Working({ tl, interrupting }) {
  const now = useNow(1000);
  const r = tl.retry;
  let text = interrupting ? "Stopping…" : "Working…";
  if (tl.waiting) text = `Waiting for a free agent process (place ${tl.waiting.position} in the queue)`;
  let retry = "";
  if (r) {
    const left = Math.max(0, Math.ceil((r.at + (r.retry_delay_ms || 0) - now) / 1000));
    retry = `The model call failed (${r.error_status || r.error || "connection"}); retry ${r.attempt} of ${r.max_retries}${left ? ` in ${duration(left * 1000)}` : ""}.`;
  }
  return (
    <div class="working">
      <span class="spinner" aria-hidden="true" />
      <span>{text}</span>
      {retry && <span class="retry-note">{retry}</span>}
    </div>
  );
}
