// The page loads from the control plane under its strict headers, with no
// console error, on a desktop and on a phone-sized screen.
import { test } from "node:test";
import assert from "node:assert/strict";
import { APP_URL, TOKEN, newPage, shot, control, signIn } from "./harness.mjs";

const CSP =
  "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

test("the control server answers", async () => {
  assert.deepEqual(await control("/health"), { ok: true });
});

test("the page loads under the strict CSP without console errors", async () => {
  const page = await newPage();
  const resp = await page.goto(APP_URL + "/", { waitUntil: "networkidle" });
  assert.equal(resp.status(), 200);
  const h = resp.headers();
  assert.equal(h["content-security-policy"], CSP);
  assert.equal(h["x-content-type-options"], "nosniff");
  assert.equal(h["referrer-policy"], "no-referrer");
  assert.equal(h["cache-control"], "no-cache");
  assert.equal(await page.title(), "TalkIDE");
  // Without a token the app asks for one.
  await page.getByRole("textbox", { name: "User token" }).waitFor();
  await shot(page, "signed out");
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test("the page fits a phone-sized screen", async () => {
  const page = await newPage({ phone: true });
  await page.goto(APP_URL + "/", { waitUntil: "networkidle" });
  await page.getByRole("textbox", { name: "User token" }).waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page is ${overflow} px wider than the screen`);
  await shot(page, "signed out on a phone");
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test("hashed assets are cached for good and unknown ones are 404", async () => {
  const page = await newPage();
  const assets = [];
  page.on("response", (r) => {
    if (new URL(r.url()).pathname.startsWith("/assets/")) assets.push(r);
  });
  await page.goto(APP_URL + "/", { waitUntil: "networkidle" });
  assert.ok(assets.length >= 1, "the page loaded no asset");
  for (const r of assets) {
    assert.equal(r.status(), 200, r.url());
    assert.equal(r.headers()["cache-control"], "public, max-age=31536000, immutable", r.url());
  }
  const missing = await fetch(APP_URL + "/assets/app-NOTTHERE.js");
  assert.equal(missing.status, 404);
  assert.equal((await missing.json()).error.type, "not_found");
  await page.context().close();
});

test("a #token link never leaves the page: no Referer, no token in any URL", async () => {
  const page = await newPage();
  const requests = [];
  page.on("request", (r) => requests.push(r));
  await signIn(page, "/?c=conv_none");
  await page.waitForLoadState("networkidle");
  assert.ok(requests.length >= 2, "the page made no request beyond itself");
  for (const r of requests) {
    assert.ok(!r.url().includes(TOKEN), `the token is in a URL: ${r.url()}`);
    const referer = (await r.allHeaders())["referer"];
    assert.equal(referer, undefined, `${r.url()} was sent Referer ${referer}`);
  }
  await page.context().close();
});
