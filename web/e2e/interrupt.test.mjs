// Interrupt stops the running turn visibly, and the conversation goes on.
import { test } from "node:test";
import { newPage, shot } from "./harness.mjs";
import { eventIds, noErrors, openDraft, openToolCall, send, turnsCompleted, TURN_TIMEOUT } from "./steps.mjs";

test("interrupt a running turn", async () => {
  const page = await newPage();
  await openDraft(page);
  await send(page, "please run `timeout 120 tail -f /dev/null`");
  const call = await openToolCall(page, "timeout 120");
  await call.getByText("running", { exact: true }).waitFor();
  const interrupt = page.getByRole("button", { name: "Interrupt" });
  await interrupt.and(page.locator(":enabled")).waitFor();
  await page.locator(".topbar").getByText("Running", { exact: true }).waitFor();
  await shot(page, "a long command running");
  await interrupt.click();
  await page.getByText("Interrupted", { exact: true }).waitFor({ timeout: TURN_TIMEOUT });
  await interrupt.and(page.locator(":disabled")).waitFor();
  // The cut call reads "stopped", not "failed".
  await call.getByText("stopped", { exact: true }).waitFor();
  await shot(page, "interrupted");

  await send(page, "please run `echo after-the-interrupt`");
  const next = await openToolCall(page, "echo after-the-interrupt");
  await next.locator(".tool-out").getByText("after-the-interrupt").waitFor({ timeout: TURN_TIMEOUT });
  await turnsCompleted(page, 1);
  await shot(page, "the next turn after the interrupt");
  await eventIds(page);
  noErrors(page);
  await page.context().close();
});
