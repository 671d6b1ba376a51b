// Following a conversation's event stream with fetch(), resuming from the
// last event id after any break (docs/browser-api.md §3).
import { SSEParser } from "./sse.js";

// Delays between reconnects, growing; the last one repeats.
const BACKOFF_MS = [500, 1000, 2000, 4000, 8000, 15000];
// After this many failed attempts in a row the state reads "Offline".
const OFFLINE_AFTER = 6;
// The control plane sends a comment every 15 s on an idle stream; nothing
// at all for this long means the connection is dead without having said
// so (a network gone quiet, a laptop that slept, a stalled proxy): the
// attempt is cut and the stream resumes on a new one.
const STALL_MS = 40000;

// follow(opts) starts following and returns a stop function.
//   url: the stream path; token(): the bearer token; lastId(): the id of
//   the last event applied (sent as Last-Event-ID);
//   onEvents(events): a batch of parsed events, in order;
//   onState(state, info): "connecting" | "connected" | "reconnecting" |
//   "offline" | "gone" (404: the conversation no longer exists) |
//   "unauthorized"; info.retryInMs when waiting.
export function follow({ url, token, lastId, onEvents, onState }) {
  const ctl = new AbortController();
  let failures = 0;
  let wake = null;

  const sleep = (ms) =>
    new Promise((res) => {
      const t = setTimeout(done, ms);
      function done() {
        clearTimeout(t);
        window.removeEventListener("online", done);
        wake = null;
        res();
      }
      wake = done;
      window.addEventListener("online", done);
    });

  async function once() {
    const headers = { Authorization: "Bearer " + token(), Accept: "text/event-stream" };
    const last = lastId();
    if (last > 0) headers["Last-Event-ID"] = String(last);
    // One attempt's own signal: cut by stop(), by the browser going
    // offline, or by the stall watchdog.
    const attempt = new AbortController();
    const cut = () => attempt.abort();
    let stall = 0;
    const arm = () => {
      clearTimeout(stall);
      stall = setTimeout(cut, STALL_MS);
    };
    ctl.signal.addEventListener("abort", cut);
    window.addEventListener("offline", cut);
    try {
      arm();
      await read(url, headers, attempt.signal, arm);
    } finally {
      clearTimeout(stall);
      ctl.signal.removeEventListener("abort", cut);
      window.removeEventListener("offline", cut);
    }
  }

  async function read(url, headers, signal, alive) {
    const r = await fetch(url, { headers, signal, cache: "no-store" });
    if (!r.ok) {
      const err = new Error("stream: " + r.status);
      err.status = r.status;
      err.retryAfter = Number(r.headers.get("Retry-After")) || 0;
      try {
        const j = await r.json();
        err.message = (j && j.error && j.error.message) || err.message;
      } catch {
        // not JSON
      }
      throw err;
    }
    failures = 0;
    onState("connected", {});
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let batch = [];
    const parser = new SSEParser((e) => {
      let ev;
      try {
        ev = JSON.parse(e.data);
      } catch {
        return;
      }
      if (ev && typeof ev.id === "number") batch.push(ev);
    });
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      alive();
      parser.feed(value);
      if (batch.length) {
        const b = batch;
        batch = [];
        onEvents(b);
      }
    }
  }

  (async () => {
    onState("connecting", {});
    while (!ctl.signal.aborted) {
      let retryAfter = 0;
      try {
        await once();
        // The server ended the stream (a control-plane shutdown): resume.
      } catch (e) {
        if (ctl.signal.aborted) return;
        if (e.status === 404) {
          onState("gone", { message: e.message });
          return;
        }
        if (e.status === 401) {
          onState("unauthorized", { message: e.message });
          return;
        }
        if (e.status === 400 && lastId() > 0) {
          // A resume point the server refuses: start over is not safe for
          // the view, so keep trying from the same point, slowly.
        }
        retryAfter = (e.retryAfter || 0) * 1000;
      }
      if (ctl.signal.aborted) return;
      failures++;
      const delay = Math.max(retryAfter, BACKOFF_MS[Math.min(failures - 1, BACKOFF_MS.length - 1)]);
      const offline = (typeof navigator !== "undefined" && navigator.onLine === false) || failures >= OFFLINE_AFTER;
      onState(offline ? "offline" : "reconnecting", { retryInMs: delay, failures });
      await sleep(delay);
    }
  })();

  return {
    stop() {
      ctl.abort();
      if (wake) wake();
    },
    // retryNow skips the wait before the next attempt.
    retryNow() {
      if (wake) wake();
    },
  };
}
