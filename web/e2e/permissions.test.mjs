// Permission requests (worker policy "ask") answered in the page: allow,
// deny with a reason, and a request raised again after the worker restarts,
// shown once and still answerable. A pending request shows in the list.
// The CLI asks only about calls it does not consider safe: `echo` alone is
// safe, writing a file is not, hence the `touch` in each command.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { control, newPage, reset, setPermissionPolicy, shot } from "./harness.mjs";
import { noErrors, openDraft, openToolCall, send, turnsCompleted, TURN_TIMEOUT } from "./steps.mjs";

// Set in each test, not in a before() hook: node runs a file's root
// before() hooks concurrently with the harness's reset().
after(async () => {
  await reset();
});

const request = (page, text) => page.getByRole("group", { name: "Permission request" }).filter({ hasText: text });

test("approve one permission request and deny another with a reason", async () => {
  await setPermissionPolicy("ask");
  const page = await newPage();
  await openDraft(page);
  await send(page, "please run `touch approved.txt && echo approved-by-me`");
  const first = request(page, "echo approved-by-me");
  await first.waitFor({ timeout: TURN_TIMEOUT });
  await first.getByText("Bash").first().waitFor();
  // The list and the header say that the conversation waits for an answer.
  await page.getByRole("navigation", { name: "Conversations" }).getByText("Needs approval").waitFor();
  await shot(page, "a pending permission request");
  await first.getByRole("button", { name: "Allow" }).click();
  await first.getByText("Allowed").waitFor();
  const call = await openToolCall(page, "echo approved-by-me");
  await call.locator(".tool-out").getByText("approved-by-me").waitFor({ timeout: TURN_TIMEOUT });
  await turnsCompleted(page, 1);
  await shot(page, "allowed and run");

  await send(page, "please run `touch refused.txt && echo refused-by-me`");
  const second = request(page, "echo refused-by-me");
  await second.waitFor({ timeout: TURN_TIMEOUT });
  await second.getByRole("textbox", { name: "Reason (optional)" }).fill("not this command");
  await shot(page, "denying with a reason");
  await second.getByRole("button", { name: "Deny" }).click();
  await second.getByText("Denied").waitFor();
  await turnsCompleted(page, 2);
  // The command did not run: its call ended without its output.
  const denied = await openToolCall(page, "echo refused-by-me");
  assert.equal(await denied.locator(".tool-out").getByText("refused-by-me", { exact: true }).count(), 0);
  await page.getByRole("navigation", { name: "Conversations" }).getByText("Needs approval").waitFor({ state: "detached" });
  await shot(page, "denied");
  noErrors(page);
  await page.context().close();
});

test("a request raised again after a worker restart shows once and can be answered", async () => {
  await setPermissionPolicy("ask");
  const page = await newPage();
  await openDraft(page);
  await send(page, "please run `touch twice.txt && echo asked-twice`");
  const req = request(page, "echo asked-twice");
  await req.waitFor({ timeout: TURN_TIMEOUT });
  const rid = await req.getAttribute("data-request-id");
  await shot(page, "request before the worker restart");

  await control("/kill-worker", { down_ms: 500 });
  await req.getByText("Asked again after the worker restarted").waitFor({ timeout: TURN_TIMEOUT });
  assert.equal(await page.locator(`[data-request-id="${rid}"]`).count(), 1, "the re-raised request is shown once");
  await shot(page, "the same request raised again");
  await req.getByRole("button", { name: "Allow" }).click();
  await req.getByText("Allowed").waitFor();
  // The turn goes on (turn_started "continued"): the agent repeats the
  // call, the worker matches it to the answered request, and it runs.
  await turnsCompleted(page, 1);
  await page.getByText("The command printed:").waitFor({ timeout: TURN_TIMEOUT });
  assert.equal(await page.locator(`[data-request-id="${rid}"]`).count(), 1);
  await shot(page, "answered after the restart");
  noErrors(page);
  await page.context().close();
});
