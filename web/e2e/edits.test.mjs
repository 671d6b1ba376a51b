// A turn that edits files: the Write and Edit tool calls show as diffs. The
// development upstream answers from a script here (control /upstream/script):
// first a Write of a new file, then an Edit of it, then a closing text.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { createConversation, newPage, reset, scriptModel, shot, signIn } from "./harness.mjs";
import { noErrors, send, turnsCompleted } from "./steps.mjs";

after(async () => {
  await reset();
});

test("a turn with a file edit shows the diff", async () => {
  const conv = await createConversation();
  const dir = conv.worker && conv.worker.work_dir;
  assert.ok(dir, "the worker reports the conversation's working directory");
  const page = await newPage();
  await signIn(page, `/?c=${conv.id}`);
  // A first turn so that the CLI's own first-message calls (the session
  // title) are behind us before the script is used.
  await send(page, "hello");
  await turnsCompleted(page, 1);

  const file = dir.replace(/\/$/, "") + "/notes.txt";
  await scriptModel([
    {
      content: [
        { type: "text", text: "I'll write the notes." },
        { type: "tool_use", id: "toolu_write_notes", name: "Write", input: { file_path: file, content: "alpha\nbeta\ngamma\n" } },
      ],
      stop_reason: "tool_use",
    },
    {
      content: [{ type: "tool_use", id: "toolu_edit_notes", name: "Edit", input: { file_path: file, old_string: "beta\n", new_string: "BETA\ndelta\n" } }],
      stop_reason: "tool_use",
    },
    { content: [{ type: "text", text: "The notes are written and edited." }], stop_reason: "end_turn" },
  ]);
  await send(page, "write the notes");
  await turnsCompleted(page, 2);

  const diffs = page.getByTestId("diff");
  await diffs.nth(1).waitFor();
  const write = page.getByTestId("tool-call").filter({ has: page.locator("summary", { hasText: "Write" }) });
  const added = await write.getByTestId("diff").locator('[data-kind="added"]').allInnerTexts();
  assert.equal(added.length, 3, "a Write shows every line added");
  const edit = page.getByTestId("tool-call").filter({ has: page.locator("summary", { hasText: "Edit" }) });
  const editDiff = edit.getByTestId("diff");
  assert.deepEqual((await editDiff.locator('[data-kind="removed"] .txt').allInnerTexts()).map((s) => s.trim()), ["beta"]);
  assert.deepEqual((await editDiff.locator('[data-kind="added"] .txt').allInnerTexts()).map((s) => s.trim()), ["BETA", "delta"]);
  await editDiff.scrollIntoViewIfNeeded();
  await shot(page, "a turn with a file edit shown as a diff");
  noErrors(page);
  await page.context().close();
});
