// Turns that edit files: the Write and Edit tool calls show as diffs. The
// development upstream's file prompts drive the real CLI ("create file `P`
// containing `T`" → Write; "in `P` replace `A` with `B`" → Read, then Edit),
// so the diffs come from the CLI's own tool calls on the agent's files.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { createConversation, newPage, reset, shot, signIn } from "./harness.mjs";
import { noErrors, send, turnsCompleted } from "./steps.mjs";

after(async () => {
  await reset();
});

test("turns with file edits show the diffs", async () => {
  const conv = await createConversation();
  const page = await newPage();
  await signIn(page, `/?c=${conv.id}`);

  await send(page, "create file `notes.txt` containing `alpha beta gamma`");
  await turnsCompleted(page, 1);
  await send(page, "in `notes.txt` replace `beta` with `BETA delta`");
  await turnsCompleted(page, 2);

  const call = (name) => page.getByTestId("tool-call").filter({ has: page.locator("summary", { hasText: name }) });
  const write = call("Write").getByTestId("diff");
  await write.waitFor();
  assert.deepEqual((await write.locator('[data-kind="added"] .txt').allInnerTexts()).map((s) => s.trim()), ["alpha beta gamma"],
    "a Write shows the new file's lines added");
  assert.equal(await write.locator('[data-kind="removed"]').count(), 0);
  await call("Read").first().waitFor();
  const edit = call("Edit").getByTestId("diff");
  assert.deepEqual((await edit.locator('[data-kind="removed"] .txt').allInnerTexts()).map((s) => s.trim()), ["beta"]);
  assert.deepEqual((await edit.locator('[data-kind="added"] .txt').allInnerTexts()).map((s) => s.trim()), ["BETA delta"]);
  await edit.scrollIntoViewIfNeeded();
  await shot(page, "a turn with a file edit shown as a diff");
  noErrors(page);
  await page.context().close();
});
