// Builds and issues: on the java-calculator sample, "run the tests" runs a
// build whose card shows its state, log tail and failed tests; "file an
// issue: …" files an issue that the Issues panel lists.
import { test } from "node:test";
import { createConversation, newPage, shot, signIn } from "./harness.mjs";
import { noErrors, send, turnsCompleted } from "./steps.mjs";

// A cold Gradle build takes a minute or more.
const BUILD_TIMEOUT = 600_000;

test("a build card with its log tail and test results, and the issues panel", async () => {
  const conv = await createConversation({ sample: "java-calculator" });
  const page = await newPage();
  await signIn(page, `/?c=${conv.id}`);
  await send(page, "run the tests");
  const card = page.getByTestId("build");
  await card.waitFor({ timeout: 120_000 });
  await shot(page, "a build starts");
  await card.getByTestId("build-state").filter({ hasText: /Succeeded|Failed|Cancelled/ }).waitFor({ timeout: BUILD_TIMEOUT });
  await card.getByTestId("build-log").waitFor();
  // The sample has a failing test on purpose.
  await card.getByText(/raisesToAPower/).first().waitFor();
  await card.scrollIntoViewIfNeeded();
  await shot(page, "the build card with failed tests and the log tail");
  await turnsCompleted(page, 1, BUILD_TIMEOUT);

  await send(page, "file an issue: The power function is wrong");
  await turnsCompleted(page, 2);
  await page.getByRole("button", { name: "Issues" }).click();
  const panel = page.getByTestId("issues");
  await panel.getByText("The power function is wrong").first().waitFor();
  await shot(page, "the issues panel");
  noErrors(page);
  await page.context().close();
});
