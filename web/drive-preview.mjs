// The preview URLs' browser test (tests/e2e/preview.rs runs it): Debian's chromium, headless, driven by
// playwright-core (from web/node_modules; nothing is downloaded). Opens each preview URL given: the page
// there (served by `python3 -m http.server` inside a sandbox) loads its script by a relative path, which only
// the preview cookie the first visit set can open, and the script talks to a WebSocket echo server in the
// same sandbox through another preview URL (the page's `ws` query parameter).
//
// Usage: node web/drive-preview.mjs URL...     (CHROMIUM overrides /usr/bin/chromium)
// Prints one JSON line: for each URL what the page showed ({script, echo}) and the requests that failed.
import { launch } from './chromium.mjs';

const urls = process.argv.slice(2);
if (urls.length === 0) {
  console.error('usage: node web/drive-preview.mjs URL...');
  process.exit(2);
}
const { context, close } = await launch();
const seen = [];
try {
  for (const url of urls) {
    const page = await context.newPage();
    const failed = [];
    const logs = [];
    page.on('response', (r) => { if (r.status() >= 400) failed.push(`${r.status()} ${r.url()}`); });
    page.on('console', (m) => logs.push(`console.${m.type()}: ${m.text()}`));
    page.on('pageerror', (e) => logs.push(`page error: ${e}`));
    await page.goto(url, { timeout: 30000 });
    try {
      await page.waitForFunction(() => document.getElementById('echo')?.textContent.startsWith('echo: '),
        null, { timeout: 30000 });
    } catch (e) {
      logs.push(`waiting for the echo: ${e.message}`);
    }
    const shown = await page.evaluate(() => ({
      script: document.getElementById('script')?.textContent,
      echo: document.getElementById('echo')?.textContent,
    }));
    seen.push({ url, ...shown, failed, logs });
    await page.close();
  }
} finally {
  await close();
}
console.log(JSON.stringify(seen));
