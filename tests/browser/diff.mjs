// Opens a page of `memsnap diff BASE NEW --html PAGE` in headless Chromium and prints what it
// saw: errors, requests, the time to paint, the curves' peaks, the causes' rows, and what a
// click on the first cause picks (its blocks' highest live bytes in each run).
//
//   node diff.mjs PAGE.html
import path from "node:path";

import { launch, watchedPage } from "./browser.mjs";

const url = "file://" + path.resolve(process.argv[2]);
const browser = await launch();
const result = { consoleErrors: [], pageErrors: [], requests: [] };
try {
  const page = await watchedPage(browser, url, { width: 1280, height: 800 }, result);
  await page.goto(url, { waitUntil: "load" });
  await page.waitForFunction(() => window.memsnapDiff && window.memsnapDiff.ready, null, { timeout: 20000 });
  result.paintMs = await page.evaluate(() => window.memsnapDiff.paintMs);
  result.causes = await page.evaluate(() => window.memsnapDiff.causes);
  result.peaks = await page.evaluate(() => window.memsnapDiff.peaks);
  result.rows = await page.evaluate(() => [...document.querySelectorAll('[data-testid="causes-table"] tbody tr')]
    .slice(0, 3).map((tr) => Number(tr.dataset.effect)));
  result.summary = await page.evaluate(() => document.querySelector('[data-testid="summary"]').textContent);
  await page.click('[data-testid="causes-table"] tbody tr');
  result.picked = await page.evaluate(() => window.memsnapDiff.picked());
  // the chart drew the picked cause: some pixels differ from the chart without it
  result.shaded = await page.evaluate(() => {
    const c = document.querySelector('[data-testid="chart"]');
    const before = c.toDataURL();
    window.memsnapDiff.pick(-1);
    const after = c.toDataURL();
    window.memsnapDiff.pick(0);
    return before !== after;
  });
} catch (e) {
  result.pageErrors.push("check failed: " + String(e));
}
await browser.close();
process.stdout.write(JSON.stringify(result) + "\n");
