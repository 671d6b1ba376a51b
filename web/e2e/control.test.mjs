// The control server the scenarios steer the platform with (harness.mjs,
// control): what each endpoint promises, checked cheaply (no model turn).
import { test } from "node:test";
import assert from "node:assert/strict";
import { control, reset, setPermissionPolicy, scriptModel, api } from "./harness.mjs";

test("the permission policy switches by restarting the worker", async () => {
  const before = await control("/state");
  assert.equal(before.permission_policy, "allow");
  const asked = await setPermissionPolicy("ask");
  assert.equal(asked.permission_policy, "ask");
  assert.notEqual(asked.worker_pid, before.worker_pid);
  const back = await reset();
  assert.equal(back.permission_policy, "allow");
});

test("set-user-limit sets and removes the user's monthly limit", async () => {
  const set = await control("/set-user-limit", { usd: "0.000001" });
  assert.equal(set.limit_usd, "0.000001");
  assert.equal(set.limit_source, "user");
  await control("/set-user-limit", { usd: "" });
  const me = await api("GET", "/api/admin/budget/users/dev", undefined, { allowError: true });
  assert.equal(me.status, 401, "the admin API is not open to the user's token");
});

test("the model can be scripted", async () => {
  const out = await scriptModel([{ content: [{ type: "text", text: "scripted" }] }]);
  assert.equal(out.queued, 1);
  await control("/upstream/reset");
});

test("the worker is killed and replaced; the control plane restarts in place", async () => {
  const s0 = await control("/state");
  const k = await control("/kill-worker", { down_ms: 0 });
  assert.equal(k.killed_pid, s0.worker_pid);
  assert.notEqual(k.pid, s0.worker_pid);
  await control("/restart-controlplane");
  const s1 = await control("/state");
  assert.equal(s1.controlplane_starts, s0.controlplane_starts + 1);
  assert.equal(s1.url, s0.url);
  const health = await fetch(s1.url + "/healthz");
  assert.equal(health.status, 200);
});
