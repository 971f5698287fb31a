// Loads the training view (/ui/training) of rollgate's viewer in Debian's
// headless Chromium and asserts what it draws for the three training steps
// cmd/rollgate's TestTrainingViewInBrowser captured (policy versions 1, 2,
// 3; groups g-step1..3 of task-train; rewards 0,0,1 / 0,1,1 / 1,1 and a
// rollout left running; one failed call in step 2):
//
//   node training.mjs   (env: BASE, TOKEN, DB, SEARCH, OUT, CHROMIUM)
//
// Screenshots go to OUT: training.png (per policy version) and
// training-groups.png (per group). Exits non-zero on a failed assertion.
import assert from "node:assert/strict";
import path from "node:path";
import { env, finish, open } from "./common.mjs";

const BASE = env("BASE"), TOKEN = env("TOKEN"), OUT = env("OUT"), DB = env("DB"), SEARCH = env("SEARCH");

const { browser, page, failures, offsite } = await open(BASE, TOKEN, { permissions: ["clipboard-read", "clipboard-write"] });
const attr = (loc, name) => loc.evaluateAll((els, n) => els.map((e) => e.getAttribute(n)), name);
try {
  // Reached from the main page.
  await page.goto(`${BASE}/ui`);
  await page.locator("#nav-training").click();
  await page.waitForURL(`${BASE}/ui/training`);

  // Per policy version: three steps, oldest first.
  const pol = page.locator("#axis-policy");
  assert.deepEqual(await attr(pol.locator("tbody tr"), "data-step"), ["1", "2", "3"], "one row per policy version");
  const points = page.locator("#chart-policy-reward g.point");
  assert.deepEqual(await attr(points, "data-mean"), ["0.3333", "0.6667", "1"], "mean reward per policy version");
  assert.deepEqual(await attr(points, "data-std"), ["0.4714", "0.4714", "0"], "its standard deviation");
  // Drawn rising: each mean's circle is higher (smaller y) than the last.
  const ys = await page.locator("#chart-policy-reward circle.mean").evaluateAll((els) => els.map((e) => Number(e.getAttribute("cy"))));
  assert.ok(ys[0] > ys[1] && ys[1] > ys[2], `the reward curve rises: cy ${ys}`);
  assert.deepEqual(await attr(page.locator("#chart-policy-calls rect.bar"), "data-value"), ["3", "4", "3"], "calls per policy version");
  assert.equal(await page.locator("#chart-policy-tokens rect.bar").count(), 6, "prompt and completion tokens, stacked, per version");
  const verified = await attr(page.locator("#chart-policy-verified rect.bar"), "data-value");
  assert.equal(verified.length, 3, "a verified-ids bar per version: " + verified);
  await pol.screenshot({ path: path.join(OUT, "training.png") });

  // Per group in time order, with what the bridge leaves out.
  const grp = page.locator("#axis-group");
  assert.deepEqual(await attr(grp.locator("tbody tr"), "data-step"), ["g-step1", "g-step2", "g-step3"], "one row per group, in time order");
  assert.deepEqual(await attr(page.locator("#chart-group-reward g.point"), "data-mean"), ["0.3333", "0.6667", "1"], "mean reward per group");
  const unfinished = page.locator('#chart-group-excluded-attempts rect.bar[data-series="not finished (status)"]');
  assert.deepEqual(await attr(unfinished, "data-step"), ["g-step3"], "step 3's running rollout is not finished");
  const errored = page.locator('#chart-group-excluded-calls rect.bar[data-series="errored"]');
  assert.deepEqual(await attr(errored, "data-step"), ["g-step2"], "step 2's failed call");
  assert.deepEqual(await attr(errored, "data-value"), ["1"], "one failed call");
  await grp.screenshot({ path: path.join(OUT, "training-groups.png") });

  // The copy button puts the step's bridge command on the clipboard.
  const button = grp.locator("tbody tr").nth(1).locator("button.copy");
  const cmd = await button.getAttribute("data-copy");
  assert.ok(cmd.startsWith(`rollgate bridge --db ${DB} --since `) && cmd.includes(" --tasks task-train ") && cmd.endsWith(" --out batch.parquet"), "the step's command: " + cmd);
  await button.click();
  await page.waitForFunction((b) => b.dataset.copied === "1", await button.elementHandle());
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), cmd, "the clipboard holds the command");

  // The search box: a rollout id, then its group.
  await page.locator("#rollout-search").fill(SEARCH);
  await page.locator("#rollout-search").press("Enter");
  await page.locator("#search-result[data-found=true]").waitFor();
  assert.equal(await page.locator("#search-rollout").innerText(), SEARCH);
  assert.match(await page.locator("#search-result button.copy").getAttribute("data-copy"), new RegExp(`--rollouts ${SEARCH} `), "the rollout's command");
  await page.locator("#search-result a.search-group").click();
  await page.waitForURL(`${BASE}/ui/groups/g-step3`);
  assert.equal(await page.locator("section.member").count(), 3, "the group page shows the group's three rollouts");
  assert.match(await page.locator("#group-cmd button.copy").getAttribute("data-copy"), /--rollouts train-3-0,train-3-1,train-3-2 /, "the group's command");

  // Hostile input is shown as text.
  await page.goto(`${BASE}/ui/training?rollout=${encodeURIComponent("<img src=x onerror=alert(1)>")}`);
  assert.match(await page.locator("#search-none").innerText(), /No rollout has this id/);
  assert.equal(await page.locator("#rollout-search").inputValue(), "<img src=x onerror=alert(1)>");
  assert.equal(await page.locator("img").count(), 0, "no element was injected");

  assert.deepEqual(offsite, [], "the page made no request outside the gateway");
} catch (e) {
  failures.push(e.message);
}
await finish(browser, failures, "ok: training view (policy, groups, copy, search, group link)");
