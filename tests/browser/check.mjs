// Opens pages of `memsnap view` in headless Chromium, uses them as a person would, and prints
// what it saw, one JSON object per page (tests/view.rs compares them with memsnap's figures).
//
//   node check.mjs JOBS.json
//
// JOBS.json: [{"page": "a.html", "out": "DIR", "interact": true, "ranks": false}, ...]. Without
// interact only loading is checked (first paint, errors, requests, the figures shown, the
// peak's breakdown); screenshots go to `out` when it is given.
import path from "node:path";

import fs from "node:fs";

import { launch } from "./browser.mjs";

const jobs = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const browser = await launch();
let url = null;
let result = null;

async function open(viewport, scheme) {
  const context = await browser.newContext({ viewport, colorScheme: scheme, deviceScaleFactor: 1 });
  const page = await context.newPage();
  page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") result.consoleErrors.push(m.type() + ": " + m.text()); });
  page.on("pageerror", (e) => result.pageErrors.push(String(e)));
  page.on("request", (r) => { if (r.url() !== url) result.requests.push(r.url()); });
  const t0 = Date.now();
  await page.goto(url, { waitUntil: "load" });
  await page.waitForFunction(() => window.memsnapView && window.memsnapView.ready, null, { timeout: 20000 });
  const wall = Date.now() - t0;
  return { context, page, wall };
}

const cards = (page) => page.evaluate(() => {
  const b = (id) => { const e = document.querySelector(`[data-testid="${id}"]`); return e && e.dataset.bytes !== undefined ? Number(e.dataset.bytes) : null; };
  const steps = [...document.querySelectorAll('[data-testid="steps-table"] tbody tr')].map((tr) => ({
    first: Number(tr.dataset.firstEvent), last: Number(tr.dataset.lastEvent), end: Number(tr.dataset.endBytes), peak: Number(tr.dataset.peakBytes) }));
  return { peakAllocated: b("peak-allocated"), peakReserved: b("peak-reserved"), startAllocated: b("start-allocated"),
    endAllocated: b("end-allocated"), fragmentation: b("fragmentation"), place: document.querySelector('[data-testid="peak-place"]').textContent,
    file: document.querySelector('[data-testid="file"]').textContent, steps,
    oomText: document.querySelector('[data-testid="oom-text"]')?.textContent ?? null,
    compareText: document.querySelector('[data-testid="compare-text"]')?.textContent ?? null };
});
const moment = (page) => page.evaluate(() => {
  const m = document.querySelector('[data-testid="moment-allocated"]');
  if (!m) return null;
  const by = {};
  for (const box of document.querySelectorAll('[data-testid^="breakdown-"]')) {
    by[box.dataset.testid.slice(10)] = [...box.querySelectorAll("tbody tr")].map((tr) => [tr.dataset.label, Number(tr.dataset.bytes)]);
  }
  const blocks = [...document.querySelectorAll('[data-testid="blocks-table"] tbody tr')].map((tr) => Number(tr.dataset.bytes));
  const flame = document.querySelectorAll('[data-testid="flame"] div').length;
  return { event: Number(m.dataset.event), allocated: Number(m.dataset.bytes), by, blocks, flame };
});

const results = [];
for (const job of jobs) {
  url = "file://" + path.resolve(job.page);
  result = { page: job.page, consoleErrors: [], pageErrors: [], requests: [] };
  try {
    await check(job.out, !!job.interact, !!job.ranks);
  } catch (e) {
    result.pageErrors.push("check failed: " + String(e));
  }
  results.push(result);
}
await browser.close();
process.stdout.write(JSON.stringify(results) + "\n");

async function check(outDir, interact, ranks) {
  const { context, page, wall } = await open({ width: 1280, height: 720 }, "light");
  result.loadMs = wall;
  result.firstPaintMs = await page.evaluate(() => window.memsnapView.firstPaint);
  result.fcpMs = await page.evaluate(() => (performance.getEntriesByName("first-contentful-paint")[0] || {}).startTime ?? null);
  result.shown = await cards(page);
  result.panels = await page.evaluate(() => window.memsnapView.data.panels.length);
  await page.click('[data-testid="peak-button"]');
  result.peakMoment = await moment(page);
  if (outDir) await page.screenshot({ path: path.join(outDir, "desktop.png") });

  if (interact) {
    // a click at 40% of the chart's width
    const box = await page.locator("#main").boundingBox();
    const left = box.x + 70, right = box.x + box.width - 14;
    await page.mouse.click(left + 0.4 * (right - left), box.y + box.height / 2);
    result.clickedMoment = await moment(page);
    // zoom: the wheel at the middle, twice, then pan with keys; every draw is timed
    const before = await page.evaluate(() => [window.memsnapView.state.x0, window.memsnapView.state.x1]);
    await page.evaluate(() => { window.memsnapView.drawTimes.length = 0; });
    await page.mouse.move(left + 0.5 * (right - left), box.y + box.height / 2);
    for (let k = 0; k < 6; k++) { await page.mouse.wheel(0, -200); }
    await page.keyboard.press("ArrowRight");
    await page.keyboard.press("ArrowLeft");
    for (let k = 0; k < 3; k++) { await page.keyboard.press("+"); }
    const after = await page.evaluate(() => [window.memsnapView.state.x0, window.memsnapView.state.x1]);
    result.zoom = { before, after };
    result.drawMs = await page.evaluate(() => window.memsnapView.drawTimes.slice());
    // drag a range to zoom into it
    await page.keyboard.press("0");
    await page.mouse.move(left + 0.2 * (right - left), box.y + 100);
    await page.mouse.down();
    await page.mouse.move(left + 0.3 * (right - left), box.y + 120, { steps: 4 });
    await page.mouse.up();
    result.dragged = await page.evaluate(() => [window.memsnapView.state.x0, window.memsnapView.state.x1]);
    // a step row zooms to its step
    const rows = await page.locator('[data-testid="steps-table"] tbody tr').count();
    if (rows > 0) {
      const k = Math.floor(rows / 2);
      await page.locator('[data-testid="steps-table"] tbody tr').nth(k).click();
      result.stepZoom = { row: k, view: await page.evaluate(() => [window.memsnapView.state.x0, window.memsnapView.state.x1]),
        moment: await moment(page) };
    }
    // each grouping draws
    for (const key of ["2", "3", "4", "5", "1"]) await page.keyboard.press(key);
    result.legends = await page.evaluate(() => document.querySelector('[data-testid="legend"]').children.length);
    await page.keyboard.press("0");
    await page.click('[data-testid="peak-button"]');
    if (outDir) await page.screenshot({ path: path.join(outDir, "desktop-peak.png"), fullPage: true });
    if (ranks) {
      result.ranks = [];
      result.thumbnails = await page.$$eval("#ranks canvas", (cs) => cs.map((c) => c.getAttribute("aria-label")));
      const n = result.panels;
      for (let k = 0; k < Math.min(n, 64); k++) {
        await page.evaluate((k) => window.memsnapView.choosePanel(k), k);
        const c = await cards(page);
        result.ranks.push({ peakAllocated: c.peakAllocated, file: c.file });
      }
      await page.evaluate(() => window.memsnapView.choosePanel(0));
    }
    result.maxDrawMs = Math.max(0, ...result.drawMs);
  }
  await context.close();

  if (interact) {
    // a phone, in the dark
    const phone = await open({ width: 390, height: 844 }, "dark");
    await phone.page.click('[data-testid="peak-button"]');
    result.phone = { scrollWidth: await phone.page.evaluate(() => document.documentElement.scrollWidth) };
    if (outDir) await phone.page.screenshot({ path: path.join(outDir, "phone-dark.png") });
    await phone.context.close();
  }
}
