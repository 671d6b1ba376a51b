import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { api, ApiError, paths } from "./api.js";
import { useVisible } from "./hooks.js";

// How often the list is read again while the page is visible. The first
// page only: cheap for the control plane, enough to see new conversations,
// states and pending permission requests.
const POLL_MS = 4000;
const PAGE = 20;

// mergeFirstPage puts a fresh first page in front of what was loaded
// before, dropping the older copies and, when the fresh page reaches past
// them, the conversations that are gone.
export function mergeFirstPage(old, page, hasMore) {
  if (!hasMore) return page;
  const seen = new Set(page.map((c) => c.id));
  const oldest = page.length ? page[page.length - 1].created_at : "";
  return page.concat(old.filter((c) => !seen.has(c.id) && (!oldest || c.created_at < oldest)));
}

// useConversationList reads the conversations of tenant-env te, newest
// first, page by page, and keeps the loaded part fresh.
export function useConversationList(te) {
  const [state, setState] = useState({ items: [], cursor: "", loaded: false, error: "", unsupported: false, more: false });
  const visible = useVisible();
  const key = te ? te.tenant + "/" + te.env : "";
  const keyRef = useRef(key);
  keyRef.current = key;
  const loadingMore = useRef(false);
  const stateRef = useRef(state);
  stateRef.current = state;

  const refresh = useCallback(async () => {
    const k = keyRef.current;
    if (!k) return;
    const [tenant, env] = k.split("/");
    try {
      const r = await api("GET", paths.list(tenant, env, "", PAGE));
      if (keyRef.current !== k) return;
      const page = (r && r.conversations) || [];
      setState((s) => {
        const paged = s.pagedBeyond;
        return {
          ...s,
          items: paged ? mergeFirstPage(s.items, page, !!r.next_cursor) : page,
          cursor: paged ? s.cursor : r.next_cursor || "",
          loaded: true,
          error: "",
          unsupported: false,
        };
      });
    } catch (e) {
      if (keyRef.current !== k) return;
      const unsupported = e instanceof ApiError && (e.status === 404 || e.status === 405);
      setState((s) => ({ ...s, loaded: true, error: unsupported ? "" : e.message, unsupported }));
    }
  }, []);

  const loadMore = useCallback(async () => {
    const k = keyRef.current;
    if (!k || loadingMore.current) return;
    const [tenant, env] = k.split("/");
    const cursor = stateRef.current.cursor;
    if (!cursor) return;
    loadingMore.current = true;
    setState((s) => ({ ...s, more: true }));
    try {
      const r = await api("GET", paths.list(tenant, env, cursor, PAGE));
      if (keyRef.current !== k) return;
      setState((s) => {
        const seen = new Set(s.items.map((c) => c.id));
        return {
          ...s,
          items: s.items.concat(((r && r.conversations) || []).filter((c) => !seen.has(c.id))),
          cursor: r.next_cursor || "",
          pagedBeyond: true,
          more: false,
          error: "",
        };
      });
    } catch (e) {
      setState((s) => ({ ...s, more: false, error: e.message }));
    } finally {
      loadingMore.current = false;
    }
  }, []);

  useEffect(() => {
    setState({ items: [], cursor: "", loaded: false, error: "", unsupported: false, more: false });
  }, [key]);

  useEffect(() => {
    if (!key || !visible) return;
    refresh();
    const t = setInterval(refresh, POLL_MS);
    return () => clearInterval(t);
  }, [key, visible]);

  return { ...state, refresh, loadMore };
}
