// Shared set-up of the browser tests (web/e2e/*.test.mjs). They run under
// `node --test --test-concurrency=1 web/e2e/`, started by the Go test
// TestBrowserUI (internal/e2e/browser_test.go), which starts the platform and
// passes it in the environment:
//
//   TALKIDE_URL          the control plane, serving the UI (http://127.0.0.1:port)
//   TALKIDE_TOKEN        the dev user's bearer token (tenant demo, env dev)
//   TALKIDE_CONTROL_URL  the Go test's control server (see control below)
//   TALKIDE_CHROMIUM     Debian's Chromium (/usr/bin/chromium)
//   TALKIDE_SCREENSHOTS  where shot() writes PNGs (test-artifacts/browser/)
//
// Each test file runs in its own node process, one after the other; the
// platform is shared, so a file starts from reset() (done here in before()):
// permission policy "allow", the default budget, no scripted model answers.
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, mkdirSync, readdirSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

function need(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run the browser tests through go test -run TestBrowserUI ./internal/e2e/ (make test does)`);
  return v;
}

export const APP_URL = need("TALKIDE_URL");
export const TOKEN = need("TALKIDE_TOKEN");
export const CONTROL_URL = need("TALKIDE_CONTROL_URL");
export const CHROMIUM = need("TALKIDE_CHROMIUM");
export const SCREENSHOTS = need("TALKIDE_SCREENSHOTS");
export const TENANT = "demo";
export const ENV = "dev";

// How long a step may wait: the real CLI takes a few seconds per turn on a
// loaded machine.
export const TIMEOUT = 30_000;

// Chromium's flags for a headless run as root in a container. Playwright adds
// --headless and, without chromiumSandbox, --no-sandbox (needed as root);
// it also gives each launch a new empty --user-data-dir in os.tmpdir(),
// which is a fresh directory of this process (below).
const FLAGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-dev-shm-usage",
];

const tmp = mkdtempSync(path.join(os.tmpdir(), "talkide-browser-"));
process.env.TMPDIR = tmp; // Playwright's profile dir goes here

let browserPromise;

/** The browser of this test file, launched on first use. */
export function browser() {
  browserPromise ??= chromium.launch({ executablePath: CHROMIUM, headless: true, args: FLAGS, timeout: 60_000 });
  return browserPromise;
}

const PHONE = { viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true, deviceScaleFactor: 2 };
const DESKTOP = { viewport: { width: 1280, height: 800 } };

/**
 * A new page in a new browser context (its own storage: nothing carries
 * over from another page). phone: a phone-sized screen with touch.
 * page.errors collects console errors and uncaught exceptions as strings;
 * page.responses the main document's responses.
 */
export async function newPage({ phone = false } = {}) {
  const b = await browser();
  const context = await b.newContext({ ...(phone ? PHONE : DESKTOP), locale: "en-US", timezoneId: "UTC" });
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  page.errors = [];
  page.on("console", (m) => {
    if (m.type() === "error") page.errors.push(`console: ${m.text()} (${m.location().url || "?"})`);
  });
  page.on("pageerror", (e) => page.errors.push(`exception: ${e.message}`));
  return page;
}

/** Opens the UI signed in as the dev user: /#token=... (path may be "/?c=<id>"). */
export async function signIn(page, pathAndQuery = "/") {
  const resp = await page.goto(`${APP_URL}${pathAndQuery}#token=${TOKEN}`, { waitUntil: "load" });
  assert.equal(resp.status(), 200, `GET ${pathAndQuery}: status ${resp.status()}`);
  return resp;
}

// Screenshots are numbered across the run (files run one after another):
// NNN-<file>-<name>.png, so a person reads them in order.
const fileTag = path.basename(process.argv[1] ?? "test").replace(/\.test\.m?js$/, "");

/** Saves a PNG of the whole page as TALKIDE_SCREENSHOTS/NNN-<file>-<name>.png and returns its path. */
export async function shot(page, name) {
  mkdirSync(SCREENSHOTS, { recursive: true });
  const n = readdirSync(SCREENSHOTS).filter((f) => f.endsWith(".png")).length + 1;
  const slug = String(name).toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "");
  const file = path.join(SCREENSHOTS, `${String(n).padStart(3, "0")}-${fileTag}-${slug}.png`);
  await page.screenshot({ path: file, fullPage: true });
  return file;
}

/**
 * Calls the Go test's control server: control("/kill-worker"),
 * control("/set-user-limit", {usd: "0.000001"}), ... (GET when body is
 * undefined and the path is /health or /state, else POST). Endpoints:
 *   GET  /health, GET /state
 *   POST /reset                  policy allow, default budget, no script
 *   POST /kill-worker            {down_ms?: 1000} SIGKILL; answers when the next worker is ready
 *   POST /restart-controlplane   {down_ms?: 0} same address and database
 *   POST /set-user-limit         {usd: "0.000001"} or {usd: ""} (remove)
 *   POST /set-permission-policy  {policy: "ask"|"allow"} (restarts the worker)
 *   POST /upstream/script        [responses] (internal/devupstream's script format)
 *   POST /upstream/reset
 */
export async function control(p, body) {
  const get = body === undefined && (p === "/health" || p === "/state");
  const resp = await fetch(CONTROL_URL + p, {
    method: get ? "GET" : "POST",
    headers: { "Content-Type": "application/json" },
    body: get ? undefined : JSON.stringify(body ?? {}),
  });
  const text = await resp.text();
  if (!resp.ok) throw new Error(`control ${p}: ${resp.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

/** Resets the shared platform (see control /reset). */
export const reset = () => control("/reset");
/** Restarts the worker with permission policy "ask" or "allow". */
export const setPermissionPolicy = (policy) => control("/set-permission-policy", { policy });
/** Queues scripted model answers (devupstream Response objects), used before the demo responder. */
export const scriptModel = (responses) => control("/upstream/script", responses);

/**
 * The browser API with the dev user's token, for set-up and checks:
 * api("POST", "/api/conversations", {tenant, env}). Returns the decoded
 * JSON (null for an empty body); throws on a status >= 300 unless
 * {allowError: true}, which returns {status, body} instead.
 */
export async function api(method, p, body, { allowError = false } = {}) {
  const resp = await fetch(APP_URL + p, {
    method,
    headers: { Authorization: `Bearer ${TOKEN}`, ...(body !== undefined ? { "Content-Type": "application/json" } : {}) },
    body: body !== undefined ? JSON.stringify(body) : undefined,
  });
  const text = await resp.text();
  const json = text ? JSON.parse(text) : null;
  if (allowError) return { status: resp.status, body: json };
  if (resp.status >= 300) throw new Error(`${method} ${p}: ${resp.status} ${text}`);
  return json;
}

/** Creates a conversation of demo/dev through the API and returns it. */
export const createConversation = (extra = {}) => api("POST", "/api/conversations", { tenant: TENANT, env: ENV, ...extra });

/**
 * Reads a conversation's event stream through the API (not the page) from
 * after `after` until match(event) holds; returns {event, events}. An event
 * is {id, type, conversation_id, time, data}. For set-up and timing
 * ("kill the worker once the turn has started"), not for what the page shows.
 */
export async function waitForEvent(conversationId, match, { after = 0, timeout = TIMEOUT } = {}) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeout);
  const events = [];
  try {
    const resp = await fetch(`${APP_URL}/api/conversations/${conversationId}/stream`, {
      headers: { Authorization: `Bearer ${TOKEN}`, "Last-Event-ID": String(after) },
      signal: ctl.signal,
    });
    if (resp.status !== 200) throw new Error(`stream of ${conversationId}: status ${resp.status}`);
    const decoder = new TextDecoder();
    let buf = "";
    for await (const chunk of resp.body) {
      buf += decoder.decode(chunk, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
        if (!data) continue;
        const ev = JSON.parse(data);
        events.push(ev);
        if (match(ev)) return { event: ev, events };
      }
    }
    throw new Error(`stream of ${conversationId} ended; events: ${events.map((e) => `${e.id}:${e.type}`).join(" ")}`);
  } catch (e) {
    if (ctl.signal.aborted) throw new Error(`no matching event within ${timeout} ms; events: ${events.map((e) => `${e.id}:${e.type}`).join(" ")}`);
    throw e;
  } finally {
    clearTimeout(timer);
    ctl.abort();
  }
}

/** Matches the end of a turn (turn_completed or turn_failed). */
export const turnEnd = (ev) => ev.type === "turn_completed" || ev.type === "turn_failed";

/**
 * Polls fn until it returns a truthy value (returned) or timeout passes
 * (throws with message). For conditions Playwright's locators cannot wait
 * for (API state, counts).
 */
export async function until(fn, { timeout = TIMEOUT, interval = 100, message = "condition" } = {}) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${message}${last ? `: ${last.message}` : ""}`);
    await new Promise((r) => setTimeout(r, interval));
  }
}

before(async () => {
  await reset();
});

after(async () => {
  if (browserPromise) await (await browserPromise).close();
  rmSync(tmp, { recursive: true, force: true });
});
