// The headless Chromium every page check runs in, and a page watched for what must not happen.
import { chromium } from "playwright-core";

// Chromium offline: no GPU, no sandbox (containers), nothing started in the background.
export function launch() {
  return chromium.launch({
    executablePath: process.env.MEMSNAP_CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
  });
}

// A new page of `viewport` whose console errors and warnings, page errors and requests for
// anything but `url` are added to `result` (consoleErrors, pageErrors, requests).
export async function watchedPage(browser, url, viewport, result) {
  const context = await browser.newContext({ viewport, deviceScaleFactor: 1 });
  const page = await context.newPage();
  page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") result.consoleErrors.push(m.type() + ": " + m.text()); });
  page.on("pageerror", (e) => result.pageErrors.push(String(e)));
  page.on("request", (r) => { if (r.url() !== url) result.requests.push(r.url()); });
  return page;
}
