// On a phone-sized screen the list is a drawer and a conversation works.
import { test } from "node:test";
import assert from "node:assert/strict";
import { newPage, shot, signIn } from "./harness.mjs";
import { noErrors, openToolCall, send, turnsCompleted, TURN_TIMEOUT } from "./steps.mjs";

test("a conversation on a phone-sized screen", async () => {
  const page = await newPage({ phone: true });
  await signIn(page, "/");
  const toggle = page.getByRole("button", { name: "Show conversations" });
  await toggle.click();
  const nav = page.getByRole("navigation", { name: "Conversations" });
  await nav.waitFor();
  await shot(page, "the conversation drawer");
  await page.getByRole("button", { name: "New conversation" }).click();
  await nav.waitFor({ state: "hidden" });
  await send(page, "please run `echo from-a-phone`");
  const call = await openToolCall(page, "echo from-a-phone");
  await call.locator(".tool-out").getByText("from-a-phone").waitFor({ timeout: TURN_TIMEOUT });
  await turnsCompleted(page, 1);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page is ${overflow} px wider than the screen`);
  await shot(page, "a turn on a phone");
  noErrors(page);
  await page.context().close();
});
