// Loads each view of rollgate's trajectory viewer in Debian's headless
// Chromium (driven by playwright-core; never a downloaded browser) and
// asserts what a person would see. Run by cmd/rollgate's
// TestViewerInBrowser, which starts the gateway and captures the rollouts:
//
//   node views.mjs   (env: BASE, TOKEN, GROUP, GOOD, CUT, BAD, OUT, CHROMIUM)
//
// Screenshots of each view go to OUT. Exits non-zero on the first failed
// assertion, printing what was expected and what the page showed.
import assert from "node:assert/strict";
import path from "node:path";
import { env, finish, open } from "./common.mjs";

const BASE = env("BASE"), TOKEN = env("TOKEN"), OUT = env("OUT");
const GROUP = env("GROUP"), GOOD = env("GOOD"), CUT = env("CUT"), BAD = env("BAD");

// Any console error (a CSP violation, a script error) or dialog (an
// injected alert) fails the run.
const { browser, page, failures, offsite, allow404 } = await open(BASE, TOKEN);
try {
  // 1. The rollout list, live.
  await page.goto(`${BASE}/ui`);
  const rows = page.locator("#rollout-rows tr[data-rollout]");
  assert.ok((await rows.count()) >= 3, "the list shows the captured rollouts");
  const good = page.locator(`tr[data-rollout="${GOOD}"]`);
  assert.match(await good.innerText(), /succeeded/, "the good rollout's status");
  assert.match(await good.locator("td").nth(4).innerText(), /^1$/, "the good rollout's reward");
  assert.match(await page.locator(`tr[data-rollout="${BAD}"] td`).nth(7).innerText(), /^1$/, "the failed rollout counts one error");
  await page.screenshot({ path: path.join(OUT, "list.png"), fullPage: true });
  // A call captured while the page is open appears without a reload.
  const live = "live-" + Date.now();
  const r = await fetch(`${BASE}/rollout/${live}/attempt/a1/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "appear" }], max_tokens: 4 }),
  });
  assert.equal(r.status, 200, "the live call went through the gateway");
  await page.locator(`tr[data-rollout="${live}"]`).waitFor({ timeout: 15000 });

  // 2. The group, side by side.
  await page.goto(`${BASE}/ui/groups/${encodeURIComponent(GROUP)}?estimator=grpo`);
  const members = page.locator("section.member");
  assert.equal(await members.count(), 3, "three rollouts in the group");
  const adv = await page.locator(`section[data-rollout="${GOOD}"] .advantage`).getAttribute("data-value");
  assert.ok(Number(adv) > 0, `the best rollout has a positive advantage (got ${adv})`);
  const badText = await page.locator(`section[data-rollout="${BAD}"]`).innerText();
  assert.match(badText, /excluded: errored/, "the failed call's exclusion reason is shown");
  await page.screenshot({ path: path.join(OUT, "group.png"), fullPage: true });

  // 3. A rollout as a conversation.
  await page.goto(`${BASE}/ui/rollouts/${encodeURIComponent(CUT)}`);
  const calls = page.locator("li.call");
  assert.equal(await calls.count(), 2, "two calls");
  assert.deepEqual(await calls.evaluateAll((els) => els.map((e) => e.dataset.seq)), ["1", "2"], "calls in sequence order");
  assert.match(await calls.nth(0).innerText(), /lookup/, "the first call's tool call is shown");
  const userText = await calls.nth(0).locator(".role-user .content").innerText();
  assert.ok(userText.includes("<img src=x onerror=alert(1)>"), "hostile text is shown as text: " + userText);
  assert.equal(await page.locator(".msg img").count(), 0, "no element was injected");
  assert.match(await calls.nth(1).innerText(), /\blength\b/, "the cut answer's finish reason");
  assert.match(await calls.nth(1).innerText(), /AIR air_truncated/, "the AIR reward on the cut call");
  await page.screenshot({ path: path.join(OUT, "rollout.png"), fullPage: true });

  // 4. Tokens: masked prompt, shaded response, the cut point.
  await page.goto(`${BASE}/ui/rollouts/${encodeURIComponent(CUT)}/calls/2?max_response=2`);
  assert.ok((await page.locator("#prompt-tokens .tok.masked").count()) > 10, "prompt tokens are marked masked");
  assert.ok((await page.locator("#prompt-tokens .tok.masked.obs").count()) > 0, "the tool result's tokens are new observations");
  assert.ok((await page.locator("#response-tokens .tok.gen[class*=lp]").count()) > 0, "response tokens are shaded by logprob");
  await page.locator("#cut-point").waitFor();
  assert.ok((await page.locator("#response-tokens .tok.cut").count()) > 0, "tokens after the cut are marked");
  const firstTok = await page.locator("#prompt-tokens .tok").first().innerText();
  assert.equal(firstTok, "<|im_start|>", "tokens are decoded by the engine's /detokenize");
  const title = await page.locator("#response-tokens .tok").first().getAttribute("title");
  assert.match(title, /logprob -?\d/, "a token's tooltip gives its logprob");
  await page.screenshot({ path: path.join(OUT, "tokens.png"), fullPage: true });

  // 5. Unknown ids.
  allow404(); // the not-found check's own 404 is logged by the browser
  const resp = await page.goto(`${BASE}/ui/rollouts/no-such-rollout`);
  assert.equal(resp.status(), 404);
  assert.match(await page.locator("#error-message").innerText(), /was not found/);

  assert.deepEqual(offsite, [], "the page made no request outside the gateway");
} catch (e) {
  failures.push(e.message);
}
await finish(browser, failures, "ok: list (live), group, rollout, tokens, not found");
