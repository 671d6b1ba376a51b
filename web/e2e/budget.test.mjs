// Spend: each turn shows its cost, the month's spend and what is left show
// in the sidebar, and a model call the budget refuses ends the turn with a
// clear "budget exhausted" alert.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { control, newPage, reset, shot, until } from "./harness.mjs";
import { noErrors, openDraft, send, spendText, turnsCompleted, turnsEnded, TURN_TIMEOUT } from "./steps.mjs";

after(async () => {
  await reset();
});

test("a turn refused by the budget says so, and spend is shown", async () => {
  const page = await newPage();
  await openDraft(page);
  await send(page, "hello, budget");
  await turnsCompleted(page, 1);
  const spend = await spendText(page);
  assert.match(spend, /This month/);
  assert.match(spend, /left of/);

  await control("/set-user-limit", { usd: "0.000001" });
  await send(page, "please run `echo too-expensive`");
  await turnsEnded(page, 2);
  const alert = page.locator(".timeline").getByRole("alert").filter({ hasText: /budget/i });
  await alert.waitFor({ timeout: TURN_TIMEOUT });
  assert.match(await alert.innerText(), /Budget exhausted/);
  // The sidebar reads the budget again after the turn: nothing is left.
  await until(async () => /(\$0\.00|-\$[\d.]+) left/.test(await spendText(page)), { message: "the spend panel to show nothing left" });
  await shot(page, "budget exhausted");

  await control("/set-user-limit", { usd: "" });
  await send(page, "hello again");
  await turnsCompleted(page, 2);
  await shot(page, "working again with the limit removed");
  noErrors(page);
  await page.context().close();
});
