// Opens a fleet page of `memsnap view SUMMARIES` in headless Chromium and prints what it saw:
// errors, requests, the time to paint, the table's first rows, the order after a click on a
// column, and what a click on a rank says.
//
//   node fleet.mjs PAGE.html
import path from "node:path";

import { launch, watchedPage } from "./browser.mjs";

const url = "file://" + path.resolve(process.argv[2]);
const browser = await launch();
const result = { consoleErrors: [], pageErrors: [], requests: [] };
try {
  const page = await watchedPage(browser, url, { width: 1280, height: 720 }, result);
  const t0 = Date.now();
  await page.goto(url, { waitUntil: "load" });
  await page.waitForFunction(() => window.memsnapFleet && window.memsnapFleet.ready, null, { timeout: 20000 });
  result.loadMs = Date.now() - t0;
  result.paintMs = await page.evaluate(() => window.memsnapFleet.paintMs);
  result.rows = await page.evaluate(() => window.memsnapFleet.rows);
  const firstRows = () => page.evaluate(() => [...document.querySelectorAll('[data-testid="ranks-table"] tbody tr')]
    .slice(0, 3).map((tr) => ({ rank: Number(tr.dataset.rank), bytes: Number(tr.dataset.bytes) })));
  result.first = await firstRows();
  result.shownRows = await page.evaluate(() => document.querySelectorAll('[data-testid="ranks-table"] tbody tr').length);
  result.strips = await page.evaluate(() => document.querySelectorAll('[data-testid="strips"] canvas').length);
  await page.click('th[data-column="0"]');
  result.byRank = await firstRows();
  await page.click('[data-testid="ranks-table"] tbody tr');
  result.detail = await page.evaluate(() => document.querySelector('[data-testid="detail"]').textContent);
} catch (e) {
  result.pageErrors.push("check failed: " + String(e));
}
await browser.close();
process.stdout.write(JSON.stringify(result) + "\n");
