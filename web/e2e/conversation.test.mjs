// A conversation from the first message: the tool call and its result, the
// cost of the turn and the spend moving, a message queued while a turn runs,
// the list, rename and delete, and the /?c= link.
import { test } from "node:test";
import assert from "node:assert/strict";
import { api, newPage, shot, signIn, until } from "./harness.mjs";
import { conversationId, eventIds, noErrors, openDraft, openToolCall, send, spendText, turnsCompleted, TURN_TIMEOUT } from "./steps.mjs";

test("send a message and see the tool call, its result, the turn's cost and the spend move", async () => {
  const page = await newPage();
  await openDraft(page);
  await shot(page, "new conversation");
  const spendBefore = await spendText(page);

  await send(page, "please run `echo hello-from-the-browser`");
  const id = await conversationId(page);
  const call = await openToolCall(page, "echo hello-from-the-browser");
  await call.getByText("Bash", { exact: true }).waitFor();
  await call.locator(".tool-out").getByText("hello-from-the-browser").waitFor({ timeout: TURN_TIMEOUT });
  await turnsCompleted(page, 1);
  await shot(page, "tool call with its output and the turn's cost");
  // The turn shows what the gateway booked for its model calls: what the
  // conversation was charged, as the list shows it.
  const costEl = page.getByTestId("turn-cost").first();
  await until(async () => (await costEl.getAttribute("data-booked")) === "true", { timeout: TURN_TIMEOUT, message: "the turn's booked cost" });
  const cost = await costEl.innerText();
  assert.match(cost, /^\$\d+\.\d+ booked$/, "the turn shows what the gateway booked");
  assert.match(await costEl.getAttribute("title"), /the agent's own list-price estimate was ≈\$/i, "the agent's estimate stays at hand");

  // The list shows it, titled by the first message, with the same spend;
  // the month's spend moved (read again after each turn).
  const nav = page.getByRole("navigation", { name: "Conversations" });
  const link = nav.getByRole("link", { name: /hello-from-the-browser/ });
  await link.waitFor();
  await until(async () => (await link.locator(".conv-spend").count()) > 0 && (await link.locator(".conv-spend").innerText()) === cost.replace(" booked", ""), {
    timeout: TURN_TIMEOUT,
    message: `the conversation's spend in the list to be the turn's ${cost}`,
  });
  await until(async () => (await spendText(page)) !== spendBefore, { timeout: TURN_TIMEOUT, message: "the spend to change after a turn" });
  await shot(page, "spend moved");

  // The link /?c=<id> opens the same conversation, with no event twice.
  const again = await newPage();
  await signIn(again, `/?c=${id}`);
  await again.getByTestId("turn-cost").first().waitFor();
  assert.equal(new URL(again.url()).hash, "", "the token stays out of the address");
  const ids = await eventIds(again);
  assert.ok(ids.length >= 4, `only ${ids.length} events shown`);
  await shot(again, "the conversation opened from its link");
  noErrors(page);
  noErrors(again);
  await again.context().close();
  await page.context().close();
});

test("a message sent while a turn runs shows Queued until its turn starts", async () => {
  const page = await newPage();
  await openDraft(page);
  await send(page, "please run `timeout 8 tail -f /dev/null; echo slow-done`");
  await page.getByRole("button", { name: "Interrupt" }).and(page.locator(":enabled")).waitFor({ timeout: TURN_TIMEOUT });
  await send(page, "please run `echo queued-after`");
  const queued = page.locator(".msg.user", { hasText: "queued-after" });
  await queued.getByText("Queued", { exact: true }).waitFor();
  await shot(page, "a queued message under the running turn");
  await turnsCompleted(page, 2);
  await queued.getByText("Queued", { exact: true }).waitFor({ state: "detached" });
  await openToolCall(page, "echo queued-after");
  await page.locator(".tool-out").getByText("queued-after").waitFor();
  await shot(page, "the queued message ran after the first turn");
  await eventIds(page);
  noErrors(page);
  await page.context().close();
});

test("rename and delete a conversation from its header", async () => {
  const page = await newPage();
  await openDraft(page);
  await send(page, "hello there");
  const id = await conversationId(page);
  await turnsCompleted(page, 1);

  await page.getByRole("button", { name: "Rename" }).click();
  const title = page.getByRole("textbox", { name: "Title" });
  await title.fill("Browser test conversation");
  await shot(page, "renaming");
  await page.getByRole("button", { name: "Save" }).click();
  await page.getByRole("heading", { name: "Browser test conversation" }).waitFor();
  const nav = page.getByRole("navigation", { name: "Conversations" });
  await nav.getByRole("link", { name: /Browser test conversation/ }).waitFor();
  assert.equal((await api("GET", `/api/conversations/${id}`)).title, "Browser test conversation");
  await shot(page, "renamed");

  await page.getByRole("button", { name: "Delete conversation" }).click();
  await page.getByRole("alertdialog").waitFor();
  await shot(page, "confirm delete");
  await page.getByRole("button", { name: "Delete", exact: true }).click();
  await nav.getByRole("link", { name: /Browser test conversation/ }).waitFor({ state: "detached" });
  await until(() => !new URL(page.url()).searchParams.get("c"), { message: "the address to leave the deleted conversation" });
  assert.equal((await api("GET", `/api/conversations/${id}`, undefined, { allowError: true })).status, 404);
  await shot(page, "deleted");
  noErrors(page);
  await page.context().close();
});
