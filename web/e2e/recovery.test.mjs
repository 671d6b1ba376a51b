// The page rides out a worker killed mid-turn (the turn fails, the next one
// works) and a control-plane restart (the stream resumes from the last
// event id: nothing lost, nothing twice).
import { test } from "node:test";
import assert from "node:assert/strict";
import { control, newPage, shot } from "./harness.mjs";
import { connectionIs, eventIds, noErrors, openDraft, openToolCall, send, turnsCompleted, TURN_TIMEOUT } from "./steps.mjs";

// A dropped stream logs a failed fetch in the console; that is expected here.
const NET = [/Failed to load resource/, /ERR_CONNECTION_REFUSED/, /network error/i, /ERR_INCOMPLETE_CHUNKED_ENCODING/, /ERR_EMPTY_RESPONSE/];

test("kill the worker mid-turn: the turn fails, the next one works", async () => {
  const page = await newPage();
  await openDraft(page);
  await send(page, "please run `timeout 120 tail -f /dev/null`");
  const call = await openToolCall(page, "timeout 120");
  await call.getByText("running", { exact: true }).waitFor();
  await shot(page, "a turn running before the worker is killed");

  await control("/kill-worker", { down_ms: 1000 });
  const alert = page.locator(".timeline").getByRole("alert");
  await alert.waitFor({ timeout: TURN_TIMEOUT });
  assert.match(await alert.innerText(), /worker restarted/i);
  await shot(page, "the turn failed with the worker");

  await send(page, "please run `echo worker-is-back`");
  const next = await openToolCall(page, "echo worker-is-back");
  await next.locator(".tool-out").getByText("worker-is-back").waitFor({ timeout: TURN_TIMEOUT });
  await turnsCompleted(page, 1);
  await connectionIs(page, "Connected");
  await shot(page, "the next turn works");
  await eventIds(page);
  noErrors(page, NET);
  await page.context().close();
});

test("restart the control plane mid-turn: the stream resumes without duplicates", async () => {
  const page = await newPage();
  await openDraft(page);
  await send(page, "please run `echo before-restart`");
  await turnsCompleted(page, 1);
  await connectionIs(page, "Connected");
  const before = await eventIds(page);

  await send(page, "please run `timeout 6 tail -f /dev/null; echo survived-restart`");
  await openToolCall(page, "survived-restart");
  await control("/restart-controlplane", { down_ms: 2000 });
  await connectionIs(page, "Connected", TURN_TIMEOUT);
  await shot(page, "reconnected after the control plane restart");
  const call = await openToolCall(page, "survived-restart");
  await call.locator(".tool-out").getByText("survived-restart").waitFor({ timeout: TURN_TIMEOUT });
  await turnsCompleted(page, 2);
  const afterIds = await eventIds(page); // throws on a duplicate
  assert.ok(afterIds.length > before.length, "new events after the restart");
  for (const id of before) assert.ok(afterIds.includes(id), `event ${id} lost after the restart`);
  await shot(page, "the turn finished across the restart");

  // A reload replays the stream from the start: the same events, once each.
  await page.reload();
  await turnsCompleted(page, 2);
  const reloaded = await eventIds(page);
  assert.deepEqual([...reloaded].sort((a, b) => a - b), [...afterIds].sort((a, b) => a - b));
  noErrors(page, NET);
  await page.context().close();
});

test("the connection state shows Offline and recovers", async () => {
  const page = await newPage();
  await openDraft(page);
  await send(page, "hello");
  await turnsCompleted(page, 1);
  await connectionIs(page, "Connected");
  await page.context().setOffline(true);
  await control("/restart-controlplane", { down_ms: 0 });
  await connectionIs(page, "Offline", TURN_TIMEOUT);
  await shot(page, "offline");
  await page.context().setOffline(false);
  await connectionIs(page, "Connected", TURN_TIMEOUT);
  await eventIds(page);
  await page.context().close();
});
