// Calls to the control plane's browser API (docs/browser-api.md) with the
// user's bearer token, which lives in sessionStorage (this tab only).

const TOKEN_KEY = "talkide-token";

export function getToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  } catch {
    return "";
  }
}

export function setToken(t) {
  try {
    if (t) sessionStorage.setItem(TOKEN_KEY, t);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // Storage refused (private mode): the token lives only in memory.
  }
  memoryToken = t || "";
}

let memoryToken = "";

export function token() {
  return getToken() || memoryToken;
}

// takeTokenFromHash reads "#token=…" from the address, keeps the token and
// removes it from the address (and the history), as the links `make run`
// and `talkide user add` print carry it there.
export function takeTokenFromHash() {
  const hash = new URLSearchParams(location.hash.slice(1));
  const t = hash.get("token");
  if (!t) return;
  setToken(t);
  hash.delete("token");
  const rest = hash.toString();
  history.replaceState(history.state, "", location.pathname + location.search + (rest ? "#" + rest : ""));
}

// ApiError is a failed call: status (0 when the network failed), type and
// message from the error body.
export class ApiError extends Error {
  constructor(status, type, message, retryAfter) {
    super(message);
    this.status = status;
    this.type = type;
    this.retryAfter = retryAfter;
  }
}

// onUnauthorized is called when the server refuses the token (401).
let onUnauthorized = () => {};
export function setUnauthorizedHandler(f) {
  onUnauthorized = f;
}

export async function api(method, path, body, { signal } = {}) {
  const headers = { Authorization: "Bearer " + token() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let r;
  try {
    r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal, cache: "no-store" });
  } catch (e) {
    if (e && e.name === "AbortError") throw e;
    throw new ApiError(0, "network", "The control plane cannot be reached. Check your connection.");
  }
  if (r.status === 204) return null;
  const text = await r.text();
  let j = null;
  try {
    j = text ? JSON.parse(text) : null;
  } catch {
    j = null;
  }
  if (!r.ok) {
    const e = (j && j.error) || {};
    if (r.status === 401) onUnauthorized();
    throw new ApiError(r.status, e.type || "http_" + r.status, e.message || `${r.status} ${r.statusText}`, Number(r.headers.get("Retry-After")) || 0);
  }
  return j;
}

const enc = encodeURIComponent;

export const paths = {
  me: (tenant) => "/api/me" + (tenant ? "?tenant=" + enc(tenant) : ""),
  list: (tenant, env, cursor, limit = 20) =>
    `/api/conversations?tenant=${enc(tenant)}&env=${enc(env)}&limit=${limit}` + (cursor ? "&cursor=" + enc(cursor) : ""),
  conv: (id) => "/api/conversations/" + enc(id),
  messages: (id) => `/api/conversations/${enc(id)}/messages`,
  interrupt: (id) => `/api/conversations/${enc(id)}/interrupt`,
  permission: (id, rid) => `/api/conversations/${enc(id)}/permissions/${enc(rid)}`,
  stream: (id) => `/api/conversations/${enc(id)}/stream`,
  calls: (id, requestIds) => `/api/conversations/${enc(id)}/calls?` + requestIds.map((r) => "request_id=" + enc(r)).join("&"),
  issues: (tenant, env, before) => `/api/tenants/${enc(tenant)}/envs/${enc(env)}/issues?limit=50` + (before ? "&before=" + before : ""),
  issue: (tenant, env, n) => `/api/tenants/${enc(tenant)}/envs/${enc(env)}/issues/${n}`,
};

// newID makes a client_message_id: 32 hex digits ([A-Za-z0-9_-], not
// starting with _ or -). crypto.randomUUID exists only in secure contexts.
export function newID() {
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  return "m" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}
