import { useCallback, useEffect, useLayoutEffect, useMemo, useRef, useState } from "preact/hooks";
import { api, ApiError, newID, paths, token } from "../lib/api.js";
import { follow } from "../lib/stream.js";
import { apply, newTimeline, pendingPermissions } from "../lib/timeline.js";
import { duration, oneLine } from "../lib/format.js";
import { useLatest, useNow } from "../lib/hooks.js";
import { Composer } from "./Composer.jsx";
import { ItemView, UserMessage } from "./Timeline.jsx";
import { TopBar } from "./TopBar.jsx";
import { Icon } from "./Icon.jsx";

const CONN_TEXT = {
  connecting: "Connecting…",
  connected: "Connected",
  reconnecting: "Reconnecting…",
  offline: "Offline",
  gone: "Offline",
  unauthorized: "Offline",
};

// ConnStatus shows whether the live stream is up. Its text is exactly
// "Connected", "Reconnecting…" or "Offline" (and "Connecting…" at first).
function ConnStatus({ conn }) {
  const s = conn.state;
  const wait = conn.retryInMs && (s === "reconnecting" || s === "offline") ? `next try in ${Math.ceil(conn.retryInMs / 1000)} s` : "";
  return (
    <span class={"conn " + s} title={wait || undefined}>
      <span class="conn-dot" aria-hidden="true" />
      <span role="status" data-testid="connection">
        {CONN_TEXT[s] || s}
      </span>
    </span>
  );
}

// ConversationView: one conversation, live: its header, the timeline from
// its event stream, and the composer.
export function ConversationView(props) {
  const { id, te, budget, initialPending, onMeta, onLive, onTurnEnd, onChanged, onDeleted } = props;
  const tl = useMemo(() => newTimeline(), [id]);
  const [, setVer] = useState(0);
  const [conn, setConn] = useState({ state: "connecting" });
  const [meta, setMeta] = useState(null);
  const [gone, setGone] = useState("");
  const [pending, setPending] = useState(() => (initialPending || []).map((p) => ({ ...p })));
  const [announce, setAnnounce] = useState("");
  const [interrupting, setInterrupting] = useState(false);
  const [actionError, setActionError] = useState("");
  const [editing, setEditing] = useState(false);
  const [confirming, setConfirming] = useState(false);
  // Cancelling the delete confirmation (Esc or Cancel) puts the focus back
  // on the button that opened it.
  const deleteButton = useRef(null);
  const wasConfirming = useRef(false);
  useEffect(() => {
    if (wasConfirming.current && !confirming && deleteButton.current) deleteButton.current.focus();
    wasConfirming.current = confirming;
  }, [confirming]);
  const scroller = useRef(null);
  const stick = useRef(true);
  const mountedAt = useRef(Date.now());
  const cb = useLatest({ onMeta, onTurnEnd, onChanged });

  // The conversation's record: title, tenant-env, state.
  const loadMeta = useCallback(async () => {
    try {
      const c = await api("GET", paths.conv(id));
      setMeta(c);
      cb.current.onMeta(c);
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) setGone("This conversation does not exist, or it was deleted.");
    }
  }, [id]);
  useEffect(() => {
    loadMeta();
  }, [loadMeta]);

  // The live stream.
  useEffect(() => {
    const f = follow({
      url: paths.stream(id),
      token,
      lastId: () => tl.lastId,
      onEvents: (evs) => {
        const prevEnd = tl.lastTurnEnd;
        let changed = false;
        let say = "";
        for (const ev of evs) {
          if (!apply(tl, ev)) continue;
          changed = true;
          if (new Date(ev.time).getTime() > mountedAt.current - 2000) say = announcement(ev) || say;
        }
        if (!changed) return;
        setVer(tl.v);
        if (say) setAnnounce(say);
        if (tl.lastTurnEnd !== prevEnd) {
          setInterrupting(false);
          cb.current.onTurnEnd();
          cb.current.onChanged();
        }
      },
      onState: (state, info) => {
        setConn({ state, ...info });
        if (state === "gone") setGone("This conversation does not exist, or it was deleted.");
      },
    });
    return () => f.stop();
  }, [id]);

  // What the list shows of this conversation comes from the stream.
  const running = !!tl.running;
  const pendingPerms = pendingPermissions(tl);
  const title = (meta && meta.title) || oneLine(tl.firstUserText, 60);
  useEffect(() => {
    const lastTime = tl.lastId ? findLastTime(tl) : "";
    onLive({ id, running, pending: pendingPerms, title, lastActivity: lastTime });
  }, [id, running, pendingPerms, title, tl.lastId]);

  useEffect(() => {
    document.title = (title ? oneLine(title, 50) + " · " : "") + "TalkIDE";
    return () => {
      document.title = "TalkIDE";
    };
  }, [title]);

  // Messages the stream has not shown yet stay as local bubbles.
  const localOnly = pending.filter((p) => !tl.users.has(p.cmid));
  useEffect(() => {
    if (localOnly.length !== pending.length) setPending(localOnly);
  });

  const send = useCallback(
    async (text, cmid) => {
      const mid = cmid || newID();
      setPending((ps) => (ps.some((p) => p.cmid === mid) ? ps.map((p) => (p.cmid === mid ? { ...p, state: "sending", error: "" } : p)) : ps.concat([{ cmid: mid, text, state: "sending" }])));
      stick.current = true;
      try {
        await api("POST", paths.messages(id), { text, client_message_id: mid });
        setPending((ps) => ps.map((p) => (p.cmid === mid ? { ...p, state: "queued" } : p)));
        if (!meta || !meta.title) setTimeout(() => cb.current.onChanged(), 500);
      } catch (e) {
        setPending((ps) => ps.map((p) => (p.cmid === mid ? { ...p, state: "failed", error: e.message } : p)));
      }
    },
    [id, meta],
  );

  // Messages handed over from the new-conversation page are sent here.
  useEffect(() => {
    for (const p of pending) if (p.state === "sending") send(p.text, p.cmid);
  }, []);

  const interrupt = async () => {
    setInterrupting(true);
    setActionError("");
    try {
      const r = await api("POST", paths.interrupt(id));
      if (r && !r.interrupted) setInterrupting(false);
    } catch (e) {
      setInterrupting(false);
      setActionError("Could not interrupt: " + e.message);
    }
  };

  const answer = useCallback((requestId, behavior, message) => api("POST", paths.permission(id, requestId), message ? { behavior, message } : { behavior }), [id]);
  const workDir = tl.workDir || (meta && meta.worker && meta.worker.work_dir) || "";
  const resend = useCallback((text) => send(text), [send]);
  const ctx = useMemo(() => ({ conv: id, answer, budget, workDir, resend }), [id, answer, budget, workDir, resend]);

  // Follow the newest output unless the reader scrolled up.
  useLayoutEffect(() => {
    const el = scroller.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  });
  const onScroll = () => {
    const el = scroller.current;
    if (el) stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 80;
  };

  if (gone) {
    return (
      <>
        <TopBar {...props}>
          <h1 class="conv-h">Conversation not found</h1>
        </TopBar>
        <div class="empty-state">
          <p>{gone}</p>
          <p>
            <a href={location.pathname} onClick={(e) => (e.preventDefault(), onDeleted())}>
              Start a new conversation
            </a>
          </p>
        </div>
      </>
    );
  }

  const teLabel = meta ? meta.tenant + " / " + meta.env : te ? te.tenant + " / " + te.env : "";
  const actions = (
    <>
      <ConnStatus conn={conn} />
      {!editing && !confirming && (
        <>
          <button type="button" class="ghost with-icon" onClick={() => setEditing(true)}>
            <Icon name="pencil" />
            <span class="btn-label">Rename</span>
          </button>
          <button type="button" class="ghost with-icon" ref={deleteButton} onClick={() => setConfirming(true)}>
            <Icon name="trash" />
            <span class="btn-label">Delete conversation</span>
          </button>
        </>
      )}
    </>
  );

  return (
    <>
      <TopBar {...props} actions={actions}>
        {editing ? (
          <RenameForm
            initial={title}
            onCancel={() => setEditing(false)}
            onSave={async (t) => {
              const c = await api("PATCH", paths.conv(id), { title: t });
              setMeta((m) => ({ ...(m || {}), ...(c || {}), title: c ? c.title : t }));
              setEditing(false);
              cb.current.onChanged();
            }}
          />
        ) : (
          <>
            <h1 class="conv-h" title={title || "Untitled"}>
              {title || "Untitled"}
            </h1>
            <span class="te-tag">{teLabel}</span>
            {running && <span class="badge run">Running</span>}
            {pendingPerms > 0 && <span class="badge warn">Needs approval</span>}
          </>
        )}
      </TopBar>
      {confirming && (
        <DeleteConfirm
          onCancel={() => setConfirming(false)}
          onDelete={async () => {
            await api("DELETE", paths.conv(id));
            onDeleted();
          }}
        />
      )}
      {actionError && (
        <p class="banner error" role="alert">
          {actionError}
        </p>
      )}
      <div class="scroller" ref={scroller} onScroll={onScroll}>
        <div class="timeline">
          {tl.items.length === 0 && tl.queue.length === 0 && localOnly.length === 0 && (
            <div class="empty-state">
              <p class="muted">{conn.state === "connected" ? "No messages yet. Ask the agent something to start." : "Loading the conversation…"}</p>
            </div>
          )}
          {tl.items.map((it) => (
            <ItemView key={it.id} item={it} v={it.v} ctx={ctx} />
          ))}
          {running && <Working tl={tl} interrupting={interrupting} />}
          {tl.queue.map((it) => (
            <ItemView key={it.id} item={it} v={it.v} ctx={ctx} />
          ))}
          {localOnly.map((p) => (
            <div key={p.cmid}>
              <UserMessage item={{ cmid: p.cmid, text: p.text }} state={p.state === "failed" ? "" : p.state} />
              {p.state === "failed" && (
                <p class="send-error" role="alert">
                  Not sent: {p.error}{" "}
                  <button type="button" class="ghost small" onClick={() => send(p.text, p.cmid)}>
                    Retry
                  </button>
                </p>
              )}
            </div>
          ))}
        </div>
      </div>
      <div class="sr-only" aria-live="polite">
        {announce}
      </div>
      <Composer onSend={(t) => send(t)} running={running} onInterrupt={interrupt} interrupting={interrupting} />
    </>
  );
}

function findLastTime(tl) {
  const it = tl.items[tl.items.length - 1];
  return it ? it.time : "";
}

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

// Working: the running turn's state, at the end of the timeline.
function Working({ tl, interrupting }) {
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

function RenameForm({ initial, onSave, onCancel }) {
  const [v, setV] = useState(initial || "");
  const [err, setErr] = useState("");
  const [busy, setBusy] = useState(false);
  const ref = useRef(null);
  useEffect(() => {
    if (ref.current) {
      ref.current.focus();
      ref.current.select();
    }
  }, []);
  return (
    <form
      class="rename"
      onSubmit={async (e) => {
        e.preventDefault();
        const t = v.trim();
        setBusy(true);
        try {
          await onSave(t);
        } catch (e2) {
          setErr(e2.message);
          setBusy(false);
        }
      }}
    >
      <label for="rename-title" class="sr-only">
        Title
      </label>
      <input
        id="rename-title"
        ref={ref}
        type="text"
        value={v}
        maxLength={200}
        onInput={(e) => setV(e.currentTarget.value.replace(/[\r\n]+/g, " "))}
        onKeyDown={(e) => {
          if (e.key === "Escape") {
            e.preventDefault();
            onCancel();
          }
        }}
        aria-invalid={err ? "true" : undefined}
        aria-describedby={err ? "rename-error" : undefined}
      />
      <button type="submit" class="primary" disabled={busy}>
        Save
      </button>
      <button type="button" class="ghost" onClick={onCancel}>
        Cancel
      </button>
      {err && (
        <span id="rename-error" class="form-error small" role="alert">
          {err}
        </span>
      )}
    </form>
  );
}

function DeleteConfirm({ onDelete, onCancel }) {
  const [busy, setBusy] = useState(false);
  const [err, setErr] = useState("");
  const ref = useRef(null);
  useEffect(() => {
    if (ref.current) ref.current.focus();
  }, []);
  return (
    <div
      class="banner confirm"
      role="alertdialog"
      aria-labelledby="delete-q"
      aria-describedby="delete-d"
      onKeyDown={(e) => {
        if (e.key === "Escape") {
          e.preventDefault();
          e.stopPropagation();
          onCancel();
        }
      }}
    >
      <div>
        <strong id="delete-q">Delete this conversation?</strong>{" "}
        <span id="delete-d">Its messages and the agent's files on the worker are removed for good.</span>
        {err && (
          <span class="form-error small" role="alert">
            {" "}
            {err}
          </span>
        )}
      </div>
      <div class="confirm-buttons">
        <button type="button" class="ghost" ref={ref} onClick={onCancel}>
          Cancel
        </button>
        <button
          type="button"
          class="danger"
          disabled={busy}
          onClick={async () => {
            setBusy(true);
            try {
              await onDelete();
            } catch (e) {
              setErr(e.message);
              setBusy(false);
            }
          }}
        >
          Delete
        </button>
      </div>
    </div>
  );
}
