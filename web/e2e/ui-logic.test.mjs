// The UI's logic without a browser: the SSE parser, the line diff, the
// Markdown reading and the timeline built from events (duplicates ignored,
// sub-agent calls nested, re-raised permission requests shown once, queued
// messages). Needs no platform.
import { test } from "node:test";
import assert from "node:assert/strict";
import { SSEParser } from "../src/lib/sse.js";
import { contextOnly, fileEdits, lineDiff } from "../src/lib/diff.js";
import { parseBlocks, parseInline } from "../src/lib/markdown.js";
import { apply, isBudgetRefusal, newTimeline, pendingPermissions } from "../src/lib/timeline.js";
import { visible } from "../src/lib/format.js";
import { readBooked, sumBooked, turnCost } from "../src/lib/booked.js";
import { newConversation } from "../src/lib/conversation.js";
import { relPath, shortInput, toolName } from "../src/lib/tools.js";
import { mergeFirstPage } from "../src/lib/conversationList.js";

test("SSE: events across chunk boundaries, CRLF, comments and multi-line data", () => {
  const got = [];
  const p = new SSEParser((e) => got.push(e));
  const stream = ": talkide conversation x\r\n\r\nid: 1\r\nevent: a\r\ndata: {\"id\":1}\r\n\r\n: heartbeat\n\nid: 2\ndata: line1\ndata: line2\n\n";
  for (const ch of stream) p.feed(ch); // one character at a time
  assert.deepEqual(got, [
    { id: "1", event: "a", data: '{"id":1}' },
    { id: "2", event: "", data: "line1\nline2" },
  ]);
});

test("diff: changed lines between unchanged ones", () => {
  const d = lineDiff("a\nb\nc\n", "a\nB\nc\nd\n");
  assert.deepEqual(
    d.map((l) => l.kind[0] + l.text),
    ["sa", "db", "aB", "sc", "ad"],
  );
  assert.deepEqual(
    lineDiff("", "x\ny").map((l) => l.kind),
    ["add", "add"],
  );
  const many = Array.from({ length: 20 }, (_, i) => "l" + i).join("\n");
  const ctx = contextOnly(lineDiff(many, many.replace("l10", "L10")), 2);
  assert.deepEqual(
    ctx.map((l) => (l.kind === "gap" ? "gap" + l.count : l.kind[0] + l.text)),
    ["gap8", "sl8", "sl9", "dl10", "aL10", "sl11", "sl12", "gap7"],
  );
  assert.equal(fileEdits("Bash", { command: "ls" }), null);
  assert.equal(fileEdits("MultiEdit", { file_path: "/f", edits: [{ old_string: "a", new_string: "b" }, { old_string: "c", new_string: "" }] }).length, 2);
});

test("markdown: code blocks, lists, inline code; no HTML, underscores kept", () => {
  const b = parseBlocks("Hi <b>x</b> `code` and **bold**\n\n```sh\nrm -rf /\n```\n- one\n- two\n\nmcp__a__b_c");
  assert.deepEqual(b[0], {
    type: "p",
    inlines: [
      { type: "text", text: "Hi <b>x</b> " },
      { type: "code", text: "code" },
      { type: "text", text: " and " },
      { type: "strong", text: "bold" },
    ],
  });
  assert.deepEqual(b[1], { type: "code", lang: "sh", text: "rm -rf /" });
  assert.equal(b[2].type, "list");
  assert.equal(b[2].items.length, 2);
  assert.deepEqual(b[3], { type: "p", inlines: [{ type: "text", text: "mcp__a__b_c" }] });
  assert.deepEqual(parseInline("a ` b"), [{ type: "text", text: "a ` b" }]);
});

const ev = (id, type, data) => ({ id, type, time: "2026-12-02T10:00:00Z", data });

test("timeline: each event once, sub-agent calls nested, queued until the turn starts", () => {
  const tl = newTimeline();
  assert.equal(apply(tl, ev(1, "user_message", { client_message_id: "m1", text: "go" })), true);
  assert.equal(tl.queue.length, 1);
  apply(tl, ev(2, "turn_started", { client_message_id: "m1" }));
  assert.equal(tl.queue.length, 0);
  assert.equal(tl.items[0].queued, false);
  assert.equal(tl.running, "m1");
  apply(tl, ev(3, "tool_use", { tool_use_id: "A", name: "Agent", input: { description: "d" } }));
  apply(tl, ev(4, "tool_use", { tool_use_id: "B", name: "Bash", input: { command: "ls" }, parent_tool_use_id: "A" }));
  apply(tl, ev(5, "tool_result", { tool_use_id: "B", content: "x", is_error: false, parent_tool_use_id: "A" }));
  assert.equal(apply(tl, ev(5, "tool_result", { tool_use_id: "B", content: "x" })), false, "a repeated id is ignored");
  assert.equal(apply(tl, ev(4, "tool_use", { tool_use_id: "B", name: "Bash" })), false);
  const agent = tl.items[1];
  assert.equal(agent.children.length, 1);
  assert.equal(agent.children[0].result.content, "x");
  assert.equal(tl.items.length, 2, "the sub-agent's call is not top-level");
  apply(tl, ev(6, "user_message", { client_message_id: "m2", text: "next" }));
  assert.equal(tl.queue[0].queued, true);
  apply(tl, ev(7, "turn_completed", { client_message_id: "m1", cost_nano_usd: 1200000, usage: {}, duration_ms: 5 }));
  assert.equal(tl.running, null);
  assert.equal(agent.stopped, true, "a call without result is stopped when its turn ends");
  assert.equal(tl.items.at(-1).kind, "turn-end");
  apply(tl, ev(8, "turn_started", { client_message_id: "m2" }));
  assert.equal(tl.items.at(-1).cmid, "m2");
});

test("timeline: a re-raised permission request is one item; budget refusals are recognised", () => {
  const tl = newTimeline();
  const req = { request_id: "r1", tool_name: "Bash", tool_use_id: "T", input: { command: "touch x" }, expires_at: "2026-12-02T10:05:00Z" };
  apply(tl, ev(1, "permission_requested", req));
  apply(tl, ev(2, "permission_requested", { ...req, reraised: true, expires_at: "2026-12-02T10:09:00Z" }));
  assert.equal(tl.items.filter((i) => i.kind === "perm").length, 1);
  assert.equal(tl.items[0].reraised, true);
  assert.equal(tl.items[0].expiresAt, "2026-12-02T10:09:00Z");
  assert.equal(pendingPermissions(tl), 1);
  apply(tl, ev(3, "permission_resolved", { request_id: "r1", behavior: "allow", reason: "answered" }));
  assert.equal(pendingPermissions(tl), 0);
  assert.equal(
    isBudgetRefusal({ api_error_status: 429, message: "API Error: 429 TalkIDE budget exhausted: your spending limit for 2026-12 is $0.000001…" }),
    true,
  );
  assert.equal(isBudgetRefusal({ api_error_status: 429, message: "rate limited" }), false);
  apply(tl, ev(4, "turn_failed", { client_message_id: "m", reason: "api_error", api_error_status: 429, message: "TalkIDE budget exhausted" }));
  assert.equal(tl.items.at(-1).budget, true);
});

test("visible: direction controls and zero-width characters show, ANSI escapes go", () => {
  assert.equal(visible("invoice\u202egnp.exe"), "invoice⟨U+202E⟩gnp.exe");
  assert.equal(visible("a\u200bb\ufeff"), "a⟨U+200B⟩b⟨U+FEFF⟩");
  assert.equal(visible("\u001b[31mred\u001b[0m and \u001b]0;title\u0007plain"), "red and plain");
  assert.equal(visible("日本語 — ok"), "日本語 — ok");
  const md = parseBlocks("look: \u202eevil");
  assert.ok(JSON.stringify(md).includes("⟨U+202E⟩"), "agent text shows the override");
});

test("timeline: a call cut by an interrupt is stopped, a denied one failed", () => {
  const tl = newTimeline();
  const ev = (id, type, data) => ({ id, type, conversation_id: "c", time: "2026-12-02T10:00:00Z", data });
  [
    ev(1, "user_message", { client_message_id: "m1", text: "x" }),
    ev(2, "turn_started", { client_message_id: "m1" }),
    ev(3, "tool_use", { tool_use_id: "t1", name: "Bash", input: { command: "sleep 100" } }),
    ev(4, "tool_result", { tool_use_id: "t1", is_error: true, content: "The user doesn't want to proceed with this tool use. Correction to the text above: this call was stopped while running, not refused before it ran." }),
    ev(5, "tool_use", { tool_use_id: "t2", name: "Bash", input: { command: "rm x" } }),
    ev(6, "tool_result", { tool_use_id: "t2", is_error: true, content: "The user doesn't want to proceed with this tool use. The tool use was rejected." }),
  ].forEach((e) => apply(tl, e));
  assert.equal(tl.tools.get("t1").result.interrupted, true);
  assert.equal(tl.tools.get("t2").result.interrupted, false);
});

test("booked cost: a turn shows what its calls were booked, read again until all are", async () => {
  const ids = ["req_a", "req_b"];
  const answers = [
    { calls: [{ request_id: "req_a", booked_nano_usd: 300000 }] },
    { calls: [{ request_id: "req_a", booked_nano_usd: 300000 }, { request_id: "req_b", booked_nano_usd: 200000 }, { request_id: "req_x", booked_nano_usd: 9 }] },
  ];
  const seen = [];
  const waits = [];
  await readBooked("c-test", ids, (s) => seen.push(s), {
    read: async () => answers.shift(),
    sleep: async (ms) => waits.push(ms),
  });
  assert.deepEqual(seen, [
    { nano: 300000, booked: 1, total: 2 },
    { nano: 500000, booked: 2, total: 2 },
  ]);
  assert.equal(waits.length, 1, "read again once, after the first delay");
  let reads = 0;
  await readBooked("c-test", ids, (s) => seen.push(s), { read: async () => reads++ });
  assert.equal(reads, 0, "a turn booked whole is not read again");

  const item = { cost: 110000000, requestIds: ids };
  const c = turnCost(item, seen.at(-1));
  assert.equal(c.label, "$0.0005 booked");
  assert.equal(c.booked, true);
  assert.match(c.title, /2 model calls.*≈\$0\.11/);
  assert.equal(turnCost(item, { nano: 300000, booked: 1, total: 2 }).label, "$0.0003 booked (1 of 2 calls)");
  assert.equal(turnCost(item, null).label, "booking…");
  assert.equal(turnCost(item, { error: "offline" }).label, "≈$0.110 est.", "an unread booking falls back to the estimate");
  assert.equal(turnCost({ cost: 110000000, requestIds: [] }, null).label, "≈$0.110 est.", "a turn that names no calls shows the estimate");
  assert.deepEqual(sumBooked(null, ids), { nano: 0, booked: 0, total: 2 });
});

// fakeAPI answers the store's calls from answers (method path -> value,
// an Error to throw, or a function of the body), and records them.
function fakeAPI(answers) {
  const calls = [];
  const call = async (method, path, body) => {
    calls.push({ method, path, body });
    const a = answers[method + " " + path];
    if (a instanceof Error) throw a;
    return typeof a === "function" ? a(body) : a;
  };
  return { call, calls };
}

test("conversation store: one change per batch, duplicates ignored, turn end told once", () => {
  const told = [];
  const on = { current: { onTurnEnd: () => told.push("turnEnd"), onChanged: () => told.push("changed") } };
  const c = newConversation("c1", { call: fakeAPI({}).call, on, now: () => Date.parse("2026-12-02T10:00:01Z") });
  const versions = [];
  const off = c.subscribe((v) => versions.push(v));
  c.receive([ev(1, "user_message", { client_message_id: "m1", text: "go" }), ev(2, "turn_started", { client_message_id: "m1" })]);
  assert.deepEqual(versions, [1], "a batch is one change");
  assert.equal(c.running(), true);
  assert.equal(c.title(), "go", "untitled: the first message names it");
  c.receive([ev(2, "turn_started", { client_message_id: "m1" })]);
  assert.deepEqual(versions, [1], "an event seen before changes nothing");
  c.state.interrupting = true;
  c.receive([ev(3, "turn_completed", { client_message_id: "m1", usage: {}, duration_ms: 5 })]);
  assert.equal(c.running(), false);
  assert.equal(c.state.interrupting, false, "the end of the turn ends a pending interrupt");
  assert.equal(c.state.announce, "The agent finished its turn.");
  assert.deepEqual(told, ["turnEnd", "changed"]);
  off();
  c.receive([ev(4, "user_message", { client_message_id: "m2", text: "more" })]);
  assert.deepEqual(versions, [1, 2], "no call after unsubscribe");
});

test("conversation store: old events are not announced", () => {
  const c = newConversation("c1", { call: fakeAPI({}).call, now: () => Date.parse("2026-12-02T11:00:00Z") });
  c.receive([ev(1, "permission_requested", { request_id: "r1", tool_name: "Bash", input: {} })]);
  assert.equal(c.state.announce, "", "an hour-old request replayed on opening is not read out");
  c.receive([{ id: 2, type: "permission_requested", time: "2026-12-02T11:00:05Z", data: { request_id: "r2", tool_name: "Write", input: {} } }]);
  assert.equal(c.state.announce, "The agent asks for permission to use Write.");
  assert.equal(c.pendingPermissions(), 2);
});

test("conversation store: a sent message is local until the stream shows it; a failed one is retried under its id", async () => {
  let fail = true;
  const api = fakeAPI({
    "POST /api/conversations/c1/messages": () => {
      if (fail) throw new Error("worker unavailable");
      return { accepted: true };
    },
  });
  const c = newConversation("c1", { call: api.call });
  await c.send("hello", "m1");
  assert.deepEqual(c.state.pending.map((p) => [p.cmid, p.state, p.error]), [["m1", "failed", "worker unavailable"]]);
  fail = false;
  const again = c.send("hello", "m1");
  assert.deepEqual(c.state.pending.map((p) => [p.cmid, p.state]), [["m1", "sending"]], "a retry shows one bubble, sending again");
  await again;
  assert.deepEqual(c.state.pending.map((p) => p.state), ["queued"]);
  assert.deepEqual(api.calls.map((x) => x.body.client_message_id), ["m1", "m1"], "the retry keeps its id, so the server sees it once");
  c.receive([ev(1, "user_message", { client_message_id: "m1", text: "hello" })]);
  assert.deepEqual(c.state.pending, [], "the stream's copy replaces the local bubble");
});

test("conversation store: handed-over messages are sent by start", async () => {
  const api = fakeAPI({ "POST /api/conversations/c1/messages": { accepted: true } });
  const c = newConversation("c1", { call: api.call, initialPending: [{ cmid: "m9", text: "first", state: "sending" }] });
  assert.equal(api.calls.length, 0, "nothing is sent before start");
  c.start();
  await new Promise((r) => setTimeout(r, 0));
  assert.deepEqual(api.calls.map((x) => [x.method, x.body.client_message_id, x.body.text]), [["POST", "m9", "first"]]);
  assert.deepEqual(c.state.pending.map((p) => p.state), ["queued"]);
});

test("conversation store: interrupt, rename, a missing conversation", async () => {
  const notFound = Object.assign(new Error("not found"), { status: 404 });
  const told = [];
  const api = fakeAPI({
    "POST /api/conversations/c1/interrupt": new Error("worker unreachable"),
    "PATCH /api/conversations/c1": (b) => ({ id: "c1", title: b.title }),
    "GET /api/conversations/c1": { id: "c1", tenant: "t", env: "dev", title: "" },
    "GET /api/conversations/gone": notFound,
  });
  const c = newConversation("c1", { call: api.call, on: { current: { onChanged: () => told.push("changed"), onMeta: (m) => told.push("meta " + m.tenant) } } });
  await c.interrupt();
  assert.equal(c.state.interrupting, false);
  assert.equal(c.state.actionError, "Could not interrupt: worker unreachable");
  await c.loadMeta();
  await c.rename("Release notes");
  assert.equal(c.title(), "Release notes");
  assert.equal(c.state.meta.tenant, "t", "the record keeps what the rename did not return");
  assert.deepEqual(told, ["meta t", "changed"]);
  const g = newConversation("gone", { call: api.call });
  await g.loadMeta();
  assert.match(g.state.gone, /does not exist/);
  const h = newConversation("c1", { call: api.call });
  h.connection("gone", {});
  assert.match(h.state.gone, /does not exist/, "a stream answered 404 says so too");
  h.connection("reconnecting", { retryInMs: 2000 });
  assert.deepEqual(h.state.conn, { state: "reconnecting", retryInMs: 2000 });
});

test("tools: an MCP tool's server, paths inside the working directory, one line of input", () => {
  assert.deepEqual(toolName("mcp__talkide-builds__run_build"), { tool: "run_build", server: "talkide-builds" });
  assert.deepEqual(toolName("Bash"), { tool: "Bash", server: "" });
  assert.equal(relPath("/w/c1/src/a.go", "/w/c1/"), "src/a.go");
  assert.equal(relPath("/w/c1", "/w/c1"), "/w/c1", "the directory itself is not inside it");
  assert.equal(relPath("/etc/passwd", "/w/c1"), "/etc/passwd");
  assert.equal(shortInput("Edit", { file_path: "/w/c1/x.txt" }, "/w/c1"), "x.txt");
  assert.equal(shortInput("Grep", { pattern: "TODO", path: "src" }), "TODO in src");
  assert.equal(shortInput("TodoWrite", { todos: [1, 2] }), "2 to-dos");
  assert.equal(shortInput("mcp__x__y", { n: 1, args: ["a", "b"] }), "a b");
});

test("conversation list: a fresh first page goes in front of the older pages loaded", () => {
  const c = (id, at) => ({ id, created_at: at });
  const old = [c("c5", "05"), c("c4", "04"), c("c3", "03"), c("c2", "02"), c("c1", "01")];
  assert.deepEqual(mergeFirstPage(old, [c("c6", "06"), c("c5", "05")], false).map((x) => x.id), ["c6", "c5"], "no more pages: the fresh page is the list");
  assert.deepEqual(
    mergeFirstPage(old, [c("c6", "06"), c("c5", "05"), c("c3", "03")], true).map((x) => x.id),
    ["c6", "c5", "c3", "c2", "c1"],
    "c4, deleted, is dropped where the fresh page reaches past it; older ones are kept once",
  );
});
