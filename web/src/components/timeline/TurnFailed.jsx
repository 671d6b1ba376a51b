import { usdString } from "../../lib/format.js";

const FAIL_TEXT = {
  worker_restarted: "The worker restarted during this turn, which was not run again. Send your message again to go on.",
  process_exited: "The agent's process ended before the turn finished.",
  start_failed: "The agent could not be started.",
  max_turns: "The turn reached its limit of model calls.",
  execution_error: "The agent failed while working.",
  api_error: "The model call failed.",
};

// TurnFailed says why a turn failed, and offers to send its message again.
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
