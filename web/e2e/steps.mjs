// Steps the browser scenarios share, on top of harness.mjs. They find
// things by accessible names, roles and data-testid attributes (the ones
// web/src sets for them) and wait on what the page shows, never on time.
import assert from "node:assert/strict";
import { signIn, until, TIMEOUT } from "./harness.mjs";

// A turn of the real CLI can take a while on a loaded machine.
export const TURN_TIMEOUT = 120_000;

/** Signs in and opens a new conversation page (created on the first message). */
export async function openDraft(page, { sample = "" } = {}) {
  await signIn(page, "/");
  await page.getByRole("button", { name: "New conversation" }).click();
  if (sample) await page.getByRole("combobox", { name: "Start from" }).selectOption(sample);
  await page.getByRole("textbox", { name: "Message" }).waitFor();
}

/** Types text into the composer and sends it with Enter. */
export async function send(page, text) {
  const box = page.getByRole("textbox", { name: "Message" });
  await box.fill(text);
  await box.press("Enter");
  await until(async () => (await box.inputValue()) === "", { message: "the composer to empty after Enter" });
}

/** The conversation id in the address (/?c=<id>), once there is one. */
export async function conversationId(page) {
  return until(() => new URL(page.url()).searchParams.get("c"), { message: "/?c=<id> in the address" });
}

/** Waits until n turns have ended (completed ones show their cost, failed ones an alert or "Interrupted"). */
export async function turnsEnded(page, n, timeout = TURN_TIMEOUT) {
  const ends = page.locator('[data-testid="turn-cost"], .timeline [role="alert"], .turn-end.interrupted');
  await until(async () => (await ends.count()) >= n, { timeout, message: `${n} turn(s) to end` });
}

/** Waits until n turns have completed (each shows data-testid="turn-cost"). */
export async function turnsCompleted(page, n, timeout = TURN_TIMEOUT) {
  await until(async () => (await page.getByTestId("turn-cost").count()) >= n, { timeout, message: `${n} completed turn(s)` });
}

/** The tool call whose summary shows text, opened. */
export async function openToolCall(page, text, { timeout = TURN_TIMEOUT } = {}) {
  const call = page.getByTestId("tool-call").filter({ has: page.locator("summary", { hasText: text }) }).first();
  await call.waitFor({ timeout });
  if (!(await call.evaluate((d) => d.open))) await call.locator("summary").first().click();
  return call;
}

/** The data-event-id values in the page, checked to be unique; returns them. */
export async function eventIds(page) {
  const ids = await page.locator("[data-event-id]").evaluateAll((els) => els.map((e) => Number(e.dataset.eventId)));
  const seen = new Set();
  const dups = ids.filter((id) => (seen.has(id) ? true : (seen.add(id), false)));
  assert.deepEqual(dups, [], "event ids shown twice");
  return ids;
}

/** The connection indicator's text. */
export const connection = (page) => page.getByTestId("connection");

/** Waits for the connection indicator to read text. */
export async function connectionIs(page, text, timeout = TIMEOUT) {
  await until(async () => (await connection(page).textContent()) === text, { timeout, message: `connection "${text}"` });
}

/** The spend panel's text. */
export const spendText = (page) => page.getByTestId("spend").innerText();

/** Asserts no console error or uncaught exception happened in page. */
export function noErrors(page, allowed = []) {
  const errs = page.errors.filter((e) => !allowed.some((re) => re.test(e)));
  assert.deepEqual(errs, []);
}
