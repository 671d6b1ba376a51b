import { useEffect, useMemo, useState } from "preact/hooks";
import { api, newID, paths, token } from "./api.js";
import { follow } from "./stream.js";
import { apply, newTimeline, pendingPermissions } from "./timeline.js";
import { oneLine } from "./format.js";
import { useLatest } from "./hooks.js";

// The state of one open conversation, in one place: the timeline built from
// its event stream, the stream's connection, the conversation's record, the
// messages this tab sent that the stream has not shown yet, and what the
// view says of them. Components read `state` and change it only through the
// store's methods; each change bumps `state.version` and tells the
// subscribers once. It needs no browser (web/e2e/ui-logic.test.mjs).

const GONE = "This conversation does not exist, or it was deleted.";

// newConversation makes the store of conversation id.
//   initialPending: messages handed over from the new-conversation page,
//     [{ cmid, text, state: "sending" }], sent by start().
//   call(method, path, body): the browser API (api.js's api by default).
//   on: { current: { onMeta(record), onTurnEnd(), onChanged() } }, the
//     view's newest callbacks (a ref, so the store outlives re-renders).
//   now(): the time in ms, for what counts as new enough to announce.
export function newConversation(id, { initialPending = [], call = api, on = { current: {} }, now = Date.now } = {}) {
  const state = {
    id,
    tl: newTimeline(),
    conn: { state: "connecting" }, // stream.js's state and its info
    meta: null, // the conversation's record, once read
    gone: "", // why the conversation cannot be shown, or ""
    pending: initialPending.map((p) => ({ ...p })), // not yet on the stream: [{ cmid, text, state: "sending"|"queued"|"failed", error }]
    announce: "", // the newest thing said to screen readers
    interrupting: false,
    actionError: "",
    version: 0,
  };
  const openedAt = now();
  const subs = new Set();
  const hook = (name, ...args) => {
    const f = on.current && on.current[name];
    if (f) f(...args);
  };
  const changed = () => {
    state.version++;
    for (const f of subs) f(state.version);
  };
  const setPending = (cmid, fields) => {
    state.pending = state.pending.map((p) => (p.cmid === cmid ? { ...p, ...fields } : p));
  };
  // Messages the stream has shown stop being local.
  const prune = () => {
    const left = state.pending.filter((p) => !state.tl.users.has(p.cmid));
    if (left.length !== state.pending.length) state.pending = left;
  };

  const store = {
    state,

    // subscribe calls f(version) after every change; it returns the
    // unsubscribe function.
    subscribe(f) {
      subs.add(f);
      return () => subs.delete(f);
    },

    // receive applies a batch of stream events ({id, type, time, data});
    // events already applied are ignored. What happened within two seconds
    // of opening or later is announced; the end of a turn ends a pending
    // interrupt and calls onTurnEnd and onChanged.
    receive(evs) {
      const prevEnd = state.tl.lastTurnEnd;
      let news = false;
      let say = "";
      for (const ev of evs) {
        if (!apply(state.tl, ev)) continue;
        news = true;
        if (new Date(ev.time).getTime() > openedAt - 2000) say = announcement(ev) || say;
      }
      if (!news) return;
      if (say) state.announce = say;
      prune();
      const ended = state.tl.lastTurnEnd !== prevEnd;
      if (ended) state.interrupting = false;
      changed();
      if (ended) {
        hook("onTurnEnd");
        hook("onChanged");
      }
    },

    // connection takes the stream's state ("connecting", "connected",
    // "reconnecting", "offline", "gone", "unauthorized") and its info
    // ({ retryInMs }).
    connection(s, info) {
      state.conn = { state: s, ...info };
      if (s === "gone") state.gone = GONE;
      changed();
    },

    // loadMeta reads the conversation's record; a 404 marks it gone.
    async loadMeta() {
      try {
        const c = await call("GET", paths.conv(id));
        state.meta = c;
        changed();
        hook("onMeta", c);
      } catch (e) {
        if (e && e.status === 404) {
          state.gone = GONE;
          changed();
        }
      }
    },

    // send sends text as a message (cmid: a failed one's, to try it again;
    // else a new id). It shows at once as a local bubble: "sending", then
    // "queued" until the stream shows it, or "failed" with the error.
    async send(text, cmid) {
      const mid = cmid || newID();
      if (state.pending.some((p) => p.cmid === mid)) setPending(mid, { state: "sending", error: "" });
      else state.pending = state.pending.concat([{ cmid: mid, text, state: "sending" }]);
      changed();
      try {
        await call("POST", paths.messages(id), { text, client_message_id: mid });
        setPending(mid, { state: "queued" });
        changed();
        if (!state.meta || !state.meta.title) setTimeout(() => hook("onChanged"), 500);
      } catch (e) {
        setPending(mid, { state: "failed", error: e.message });
        changed();
      }
    },

    // start sends the messages handed over as "sending".
    start() {
      for (const p of state.pending) if (p.state === "sending") store.send(p.text, p.cmid);
    },

    // interrupt asks the worker to stop the running turn; "Stopping…" shows
    // until the turn ends (or at once nothing was running).
    async interrupt() {
      state.interrupting = true;
      state.actionError = "";
      changed();
      try {
        const r = await call("POST", paths.interrupt(id));
        if (r && !r.interrupted) {
          state.interrupting = false;
          changed();
        }
      } catch (e) {
        state.interrupting = false;
        state.actionError = "Could not interrupt: " + e.message;
        changed();
      }
    },

    // answer answers permission request requestId ("allow" or "deny", with
    // an optional message); the stream shows the outcome.
    answer(requestId, behavior, message) {
      return call("POST", paths.permission(id, requestId), message ? { behavior, message } : { behavior });
    },

    // rename sets the title; errors are thrown to the form.
    async rename(title) {
      const c = await call("PATCH", paths.conv(id), { title });
      state.meta = { ...(state.meta || {}), ...(c || {}), title: c ? c.title : title };
      changed();
      hook("onChanged");
    },

    // remove deletes the conversation; errors are thrown to the dialog.
    remove() {
      return call("DELETE", paths.conv(id));
    },

    // What the page shows, derived from the state.
    title: () => (state.meta && state.meta.title) || oneLine(state.tl.firstUserText, 60),
    running: () => !!state.tl.running,
    pendingPermissions: () => pendingPermissions(state.tl),
    workDir: () => state.tl.workDir || (state.meta && state.meta.worker && state.meta.worker.work_dir) || "",
    lastActivity: () => {
      const it = state.tl.items[state.tl.items.length - 1];
      return it ? it.time : "";
    },
  };
  return store;
}

// announcement is what a screen reader is told of ev, or "".
function announcement(ev) {
  const d = ev.data || {};
  switch (ev.type) {
    case "permission_requested":
      return `The agent asks for permission to use ${d.tool_name}.`;
    case "turn_completed":
      return "The agent finished its turn.";
    case "build_completed":
      return `The build ${d.phase}.`;
    default:
      return "";
  }
}

// useConversation is the store of conversation id for a view: made once per
// id, its record read, its stream followed and the handed-over messages
// sent while the view is mounted; the view re-renders on every change.
// callbacks: { onMeta, onTurnEnd, onChanged }, the newest used.
export function useConversation(id, initialPending, callbacks) {
  const on = useLatest(callbacks);
  const store = useMemo(() => newConversation(id, { initialPending: initialPending || [], on }), [id]);
  const [, setVersion] = useState(0);
  useEffect(() => store.subscribe(setVersion), [store]);
  useEffect(() => {
    store.loadMeta();
    store.start();
    const f = follow({
      url: paths.stream(id),
      token,
      lastId: () => store.state.tl.lastId,
      onEvents: store.receive,
      onState: store.connection,
    });
    return () => f.stop();
  }, [store]);
  return store;
}
