import { turnCost, useBooked } from "../../lib/booked.js";
import { duration, tokens } from "../../lib/format.js";

// TurnEnd closes a completed turn: what the gateway booked for it, its
// tokens and its duration.
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
