import { useEffect, useRef, useState } from "preact/hooks";
import { api, paths } from "../lib/api.js";
import { relTime } from "../lib/format.js";
import { useNow, useVisible } from "../lib/hooks.js";
import { Markdown } from "./Markdown.jsx";
import { Icon } from "./Icon.jsx";

const POLL_MS = 10000;

// IssuesPanel lists the issues of the workspace (the talkide-issue-tracking
// list the agents file into), newest first.
export function IssuesPanel({ te, onOpen, onClose }) {
  const [state, setState] = useState({ issues: null, error: "" });
  const [filter, setFilter] = useState("open");
  const visible = useVisible();
  const now = useNow(30000);
  const heading = useRef(null);
  const key = te.tenant + "/" + te.env;

  useEffect(() => {
    if (heading.current) heading.current.focus();
  }, []);

  useEffect(() => {
    if (!visible) return;
    let stop = false;
    const load = async () => {
      try {
        const r = await api("GET", paths.issues(te.tenant, te.env) + "&state=" + filter);
        if (!stop) setState({ issues: (r && r.issues) || [], error: "" });
      } catch (e) {
        if (!stop) setState((s) => ({ ...s, error: e.message }));
      }
    };
    load();
    const t = setInterval(load, POLL_MS);
    return () => {
      stop = true;
      clearInterval(t);
    };
  }, [key, filter, visible]);

  const issues = state.issues;
  return (
    <aside class="issues-panel" aria-labelledby="issues-h" data-testid="issues">
      <div class="panel-head">
        <h2 id="issues-h" tabIndex={-1} ref={heading}>
          Issues <span class="muted small">{te.tenant + " / " + te.env}</span>
        </h2>
        <button type="button" class="icon-btn" aria-label="Close issues" onClick={onClose}>
          <Icon name="close" />
        </button>
      </div>
      <div class="seg" role="radiogroup" aria-label="Show">
        {["open", "closed", "all"].map((f) => (
          <button type="button" role="radio" aria-checked={filter === f ? "true" : "false"} class={filter === f ? "on" : ""} onClick={() => setFilter(f)}>
            {f[0].toUpperCase() + f.slice(1)}
          </button>
        ))}
      </div>
      {state.error && (
        <p class="form-error small" role="alert">
          Could not load the issues: {state.error}
        </p>
      )}
      {issues === null && !state.error && <p class="muted small">Loading…</p>}
      {issues && issues.length === 0 && <p class="muted small">No {filter === "all" ? "" : filter + " "}issues. Agents file issues here with their issue-tracking tool.</p>}
      <ul class="issue-list">
        {(issues || []).map((is) => (
          <li key={is.number}>
            <Issue is={is} te={te} now={now} onOpen={onOpen} />
          </li>
        ))}
      </ul>
    </aside>
  );
}

function Issue({ is, te, now, onOpen }) {
  const [full, setFull] = useState(null);
  return (
    <details
      class="issue"
      onToggle={async (e) => {
        if (!e.currentTarget.open || full) return;
        try {
          setFull(await api("GET", paths.issue(te.tenant, te.env, is.number)));
        } catch {
          // the list's copy is enough
        }
      }}
    >
      <summary>
        <span class={"badge " + (is.state === "open" ? "ok" : "")}>{is.state === "open" ? "Open" : "Closed"}</span>
        <span class="issue-title">
          <span class="muted">#{is.number}</span> {is.title}
        </span>
        <span class="muted small issue-time">{relTime(is.created_at, now)}</span>
      </summary>
      <div class="issue-body">
        {is.body ? <Markdown text={is.body} /> : <p class="muted small">No description.</p>}
        {full &&
          (full.comments || []).map((c) => (
            <div class="issue-comment">
              <div class="muted small">
                {c.user_id} · {relTime(c.created_at, now)}
              </div>
              <Markdown text={c.body} />
            </div>
          ))}
        {is.conversation_id && (
          <p class="small">
            Filed from{" "}
            <a
              href={"?c=" + encodeURIComponent(is.conversation_id)}
              onClick={(e) => {
                if (e.ctrlKey || e.metaKey || e.shiftKey) return;
                e.preventDefault();
                onOpen(is.conversation_id);
              }}
            >
              its conversation
            </a>
            {is.user_id ? ` by ${is.user_id}` : ""}
          </p>
        )}
      </div>
    </details>
  );
}
