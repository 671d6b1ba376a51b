import { useEffect, useState } from "preact/hooks";
import { api, paths } from "./api.js";
import { usdFromNano } from "./format.js";

// What the gateway booked for a turn's model calls (its request_ids), read
// from GET /api/conversations/{id}/calls. A call is booked just after its
// answer ends, so a turn that has just ended may not be booked whole yet:
// the read is repeated a few times, then given up (a call that failed
// before the upstream answered is never booked).

// retryDelays are the waits (ms) between reads while some calls are not
// booked yet.
export const retryDelays = [300, 700, 1500, 3000, 6000];

// known caches complete answers by conversation and ids, so a turn shown
// again (a re-render, a conversation opened again) is not read again.
const known = new Map();

// sumBooked adds up an answer of the calls endpoint for the given ids:
// { nano, booked, total }.
export function sumBooked(answer, requestIds) {
  const want = new Set(requestIds);
  let nano = 0;
  let booked = 0;
  for (const c of (answer && answer.calls) || []) {
    if (!want.has(c.request_id)) continue;
    nano += Number(c.booked_nano_usd) || 0;
    booked++;
  }
  return { nano, booked, total: want.size };
}

// readBooked reads what a turn's calls were booked, retrying while some are
// missing; onUpdate gets each { nano, booked, total } read. It resolves when
// all are booked or the retries are spent; signal cancels it.
// read (for tests) replaces the request: read(conv, requestIds, signal)
// returns the endpoint's answer.
export async function readBooked(conv, requestIds, onUpdate, { signal, delays = retryDelays, sleep, read } = {}) {
  const key = conv + " " + requestIds.join(",");
  if (known.has(key)) {
    onUpdate(known.get(key));
    return;
  }
  const wait = sleep || ((ms) => new Promise((r) => setTimeout(r, ms)));
  const get = read || ((c, ids, s) => api("GET", paths.calls(c, ids), undefined, { signal: s }));
  for (let i = 0; ; i++) {
    const sum = sumBooked(await get(conv, requestIds, signal), requestIds);
    if (signal && signal.aborted) return;
    onUpdate(sum);
    if (sum.booked === sum.total) {
      known.set(key, sum);
      return;
    }
    if (i >= delays.length) return;
    await wait(delays[i]);
    if (signal && signal.aborted) return;
  }
}

// useBooked is readBooked as a hook: null until the first read, then
// { nano, booked, total }; a failed read leaves { error }.
export function useBooked(conv, requestIds) {
  const [sum, setSum] = useState(null);
  const key = requestIds && requestIds.length ? conv + " " + requestIds.join(",") : "";
  useEffect(() => {
    if (!key || !conv) return undefined;
    const ac = new AbortController();
    readBooked(conv, requestIds, setSum, { signal: ac.signal }).catch((e) => {
      if (!ac.signal.aborted) setSum({ error: e.message });
    });
    return () => ac.abort();
  }, [key]);
  return sum;
}

// turnCost is what a turn end says it cost: what the gateway booked for its
// calls (booked, from useBooked), else the agent's own list-price estimate,
// marked as one.
export function turnCost(item, booked) {
  const est = "≈" + usdFromNano(item.cost);
  const estTitle =
    "The agent's own estimate of this turn at list price for the model it asked for. Your budget is charged what the gateway books for each model call: the conversation's spend in the list and the month's spend below it.";
  if (!item.requestIds || !item.requestIds.length) return { label: est + " est.", title: estTitle };
  if (!booked) return { label: "booking…", title: "Reading what the gateway booked for this turn's model calls." };
  if (booked.error) return { label: est + " est.", title: "What the gateway booked could not be read (" + booked.error + "). " + estTitle };
  const calls = booked.total === 1 ? "1 model call" : booked.total + " model calls";
  const label = usdFromNano(booked.nano) + " booked" + (booked.booked < booked.total ? ` (${booked.booked} of ${booked.total} calls)` : "");
  return {
    label,
    booked: true,
    title: `What the gateway booked for this turn's ${calls}: what your budget was charged. The agent's own list-price estimate was ${est}.`,
  };
}
