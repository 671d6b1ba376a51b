import { useNow } from "../lib/hooks.js";
import { Icon } from "./Icon.jsx";
import { relTime, usdExact, usdString } from "../lib/format.js";

export function convTitle(c) {
  return (c && c.title) || "Untitled";
}

// Sidebar: the tenant-env, its conversations (newest first), the user's
// spend and the way out. On a narrow screen it is a drawer.
export function Sidebar({ me, meError, te, onTE, list, current, live, onOpen, onNew, onSignOut, budget }) {
  const now = useNow(30000);
  const grants = (me && me.grants) || [];
  const teValue = te ? te.tenant + "/" + te.env : "";
  return (
    <aside class="sidebar" id="sidebar">
      <div class="brand">
        <span class="logo" aria-hidden="true">
          ◆
        </span>{" "}
        TalkIDE
      </div>
      <div class="side-controls">
        {grants.length > 1 ? (
          <label class="te-picker">
            <span class="label">Workspace</span>
            <select
              value={teValue}
              onChange={(e) => {
                const [tenant, env] = e.currentTarget.value.split("/");
                onTE({ tenant, env });
              }}
            >
              {grants.map((g) => (
                <option value={g.tenant + "/" + g.env}>{g.tenant + " / " + g.env}</option>
              ))}
            </select>
          </label>
        ) : (
          <div class="te-picker">
            <span class="label">Workspace</span>
            <span class="te-name">{te ? te.tenant + " / " + te.env : "…"}</span>
          </div>
        )}
        <button type="button" class="primary new-conv" onClick={onNew} disabled={!te}>
          <Icon name="plus" /> New conversation
        </button>
      </div>
      {meError && (
        <p class="form-error small" role="alert">
          {meError}
        </p>
      )}
      {me && grants.length === 0 && <p class="muted small pad">You have no workspace yet: ask your administrator for access to a tenant-env.</p>}
      <nav aria-label="Conversations" class="conv-nav">
        {list.unsupported && <p class="muted small pad">This control plane does not list conversations.</p>}
        {list.error && (
          <p class="form-error small pad" role="alert">
            Could not load the conversations: {list.error}
          </p>
        )}
        {list.loaded && !list.unsupported && list.items.length === 0 && !list.error && <p class="muted small pad">No conversations yet.</p>}
        <ul class="conv-list">
          {list.items.map((c) => {
            const isCur = c.id === current;
            const running = isCur && live.id === c.id ? live.running : c.state === "running";
            const pending = isCur && live.id === c.id ? live.pending : c.pending_permissions || 0;
            const title = convTitle(isCur && live.id === c.id && live.title ? { title: live.title } : c);
            const last = isCur && live.id === c.id && live.lastActivity ? live.lastActivity : c.last_activity_at || c.created_at;
            return (
              <li key={c.id}>
                <a
                  href={"?c=" + encodeURIComponent(c.id)}
                  class={"conv-item" + (isCur ? " current" : "")}
                  aria-current={isCur ? "page" : undefined}
                  onClick={(e) => {
                    if (e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
                    e.preventDefault();
                    onOpen(c.id);
                  }}
                >
                  <span class="conv-title">{title}</span>
                  <span class="conv-meta">
                    {pending > 0 && <span class="badge warn">Needs approval</span>}
                    {running && <span class="badge run">Running</span>}
                    <span class="conv-time" title={last}>
                      {relTime(last, now)}
                    </span>
                    {c.spent_usd && Number(c.spent_usd) > 0 ? <span class="conv-spend">{usdString(c.spent_usd)}</span> : null}
                  </span>
                </a>
              </li>
            );
          })}
        </ul>
        {list.cursor && (
          <button type="button" class="ghost load-more" onClick={list.loadMore} disabled={list.more}>
            {list.more ? "Loading…" : "Load more"}
          </button>
        )}
      </nav>
      <div class="side-foot">
        <Spend budget={budget} />
        <div class="who">
          <span class="muted small">{me && me.user ? "Signed in as " + me.user : ""}</span>
          <button type="button" class="ghost small" onClick={onSignOut}>
            Sign out
          </button>
        </div>
      </div>
    </aside>
  );
}

export function Spend({ budget }) {
  if (!budget) {
    return (
      <div class="spend" data-testid="spend">
        <span class="muted small">Spend: not available</span>
      </div>
    );
  }
  const limit = Number(budget.limit_usd);
  const spent = Number(budget.spent_usd) + Number(budget.reserved_usd || 0);
  const pct = limit > 0 ? Math.min(100, Math.max(0, (spent / limit) * 100)) : 0;
  const low = limit > 0 && Number(budget.remaining_usd) <= limit * 0.1;
  return (
    <div class={"spend" + (low ? " low" : "")} data-testid="spend">
      <div class="spend-row">
        <span>
          <span class="muted">This month</span> <strong>{usdString(budget.spent_usd)}</strong>
        </span>
        <span>
          <strong>{usdExact(budget.remaining_usd)}</strong> <span class="muted">left of {usdString(budget.limit_usd)}</span>
        </span>
      </div>
      <div
        class="meter"
        role="meter"
        aria-label="Budget used"
        aria-valuemin="0"
        aria-valuemax={limit || 0}
        aria-valuenow={spent || 0}
        aria-valuetext={`${usdString(budget.spent_usd)} spent of ${usdString(budget.limit_usd)}`}
      >
        <span class="meter-fill" style={{ width: pct + "%" }} />
      </div>
    </div>
  );
}
