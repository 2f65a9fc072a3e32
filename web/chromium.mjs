// Debian's chromium, headless, driven by playwright-core (from web/node_modules; nothing is downloaded), with
// a profile of its own that `close` removes. The browser tests (drive-terminal.mjs, drive-preview.mjs) start
// it here. CHROMIUM overrides /usr/bin/chromium.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

// Without the background-networking flags chromium reaches out to Google's services on start.
const args = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--disable-default-apps', '--disable-extensions'];

// A browser context (`options` adds to playwright's launch options, e.g. a viewport) and its `close`.
export async function launch(options = {}) {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'mentis-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args,
    timeout: 60000,
    ...options,
  });
  const close = async () => {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  };
  return { context, close };
}
