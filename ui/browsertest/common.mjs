// Shared by the browser tests: the environment, Debian's headless Chromium
// with the gateway's admin token, and the checks every page gets (no
// console error, no script error, no dialog, no request off the gateway).
import { chromium } from "playwright-core";

export const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};

// open launches the browser and a page on BASE; failures collects what
// went wrong, offsite the requests outside BASE. allow404() lets the
// browser's own log of an expected 404 pass.
export async function open(BASE, TOKEN, contextOptions = {}) {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  const context = await browser.newContext({
    httpCredentials: { username: "admin", password: TOKEN },
    viewport: { width: 1280, height: 900 },
    ...contextOptions,
  });
  const page = await context.newPage();
  const failures = [], offsite = [];
  let expect404 = false;
  page.on("console", (m) => {
    if (m.type() !== "error") return;
    if (expect404 && m.text().includes("status of 404")) return;
    failures.push("console error: " + m.text() + " at " + m.location().url);
  });
  page.on("pageerror", (e) => failures.push("page error: " + e.message));
  page.on("dialog", (d) => { failures.push("a dialog opened: " + d.message()); d.dismiss(); });
  page.on("request", (r) => { if (!r.url().startsWith(BASE)) offsite.push(r.url()); });
  return { browser, context, page, failures, offsite, allow404: () => { expect404 = true; } };
}

// finish closes the browser, then exits non-zero listing the failures, or
// prints ok.
export async function finish(browser, failures, ok) {
  await browser.close();
  if (failures.length) {
    console.error("FAIL\n" + failures.join("\n"));
    process.exit(1);
  }
  console.log(ok);
}
