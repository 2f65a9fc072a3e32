// The preview URLs' browser test (tests/e2e/preview.rs runs it): Debian's chromium, headless, driven by
// playwright-core (from web/node_modules; nothing is downloaded). Opens each preview URL given: the page
// there (served by `python3 -m http.server` inside a sandbox) loads its script by a relative path, which only
// the preview cookie the first visit set can open, and the script talks to a WebSocket echo server in the
// same sandbox through another preview URL (the page's `ws` query parameter).
//
// Usage: node web/drive-preview.mjs URL...     (CHROMIUM overrides /usr/bin/chromium)
// Prints one JSON line: for each URL what the page showed ({script, echo}) and the requests that failed.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const urls = process.argv.slice(2);
if (urls.length === 0) {
  console.error('usage: node web/drive-preview.mjs URL...');
  process.exit(2);
}
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'mentis-chromium-'));
const args = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--disable-default-apps', '--disable-extensions'];
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args,
  timeout: 60000,
});
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
  await context.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(seen));
