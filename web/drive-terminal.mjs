// The web terminal's browser test (tests/e2e/web.rs runs it): Debian's chromium, headless, driven by
// playwright-core (from web/node_modules; nothing is downloaded). Opens the page at the link given, types
// `echo $((6*7))` and reads 42 from xterm.js's buffer, checks `stty size` before and after the window is
// resized, and saves a screenshot.
//
// Usage: node web/drive-terminal.mjs URL SCREENSHOT.png     (CHROMIUM overrides /usr/bin/chromium)
// Prints one JSON line with what it saw; exits 1 (with the terminal's text) when something is not as expected.
import { launch } from './chromium.mjs';

const [url, screenshot] = process.argv.slice(2);
if (!url || !screenshot) {
  console.error('usage: node web/drive-terminal.mjs URL SCREENSHOT.png');
  process.exit(2);
}
const { context, close } = await launch({ viewport: { width: 800, height: 420 } });
const page = context.pages()[0] || (await context.newPage());
const logs = [];
page.on('console', (m) => logs.push(`console.${m.type()}: ${m.text()}`));
page.on('pageerror', (e) => logs.push(`page error: ${e}`));
// Everything the page loads comes from the runtime (no CDN).
const origin = new URL(url).origin;
const elsewhere = [];
page.on('request', (r) => { if (!r.url().startsWith(origin + '/') && !r.url().startsWith(origin.replace('http', 'ws') + '/')) elsewhere.push(r.url()); });

const screen = () => page.evaluate(() => {
  const b = window.mentis.term.buffer.active;
  const lines = [];
  for (let i = 0; i < b.length; i++) lines.push(b.getLine(i).translateToString(true));
  return lines;
});
const size = () => page.evaluate(() => ({ cols: window.mentis.term.cols, rows: window.mentis.term.rows }));
// Waits until a line of the terminal, after the first `from` lines, is `want`; returns its index.
async function line(want, from = 0, timeout = 30000) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const lines = await screen();
    const at = lines.findIndex((l, i) => i >= from && l.trim() === want);
    if (at >= 0) return at;
    if (Date.now() > deadline) throw new Error(`no line "${want}" on the terminal`);
    await page.waitForTimeout(100);
  }
}
async function type(text) {
  await page.keyboard.type(text, { delay: 10 });
  await page.keyboard.press('Enter');
}

let result = {};
try {
  await page.goto(url);
  await page.waitForFunction(() => window.mentis && window.mentis.state === 'open', null, { timeout: 60000 });
  // The login shell's prompt, then a command.
  await page.waitForFunction(() => {
    const b = window.mentis.term.buffer.active;
    return b.getLine(b.cursorY + b.baseY).translateToString(true).trim().length > 0;
  }, null, { timeout: 30000 });
  await page.locator('#terminal').click();
  await type('echo $((6*7))');
  const answer = await line('42');
  const before = await size();
  await type('stty size');
  const sawBefore = await line(`${before.rows} ${before.cols}`, answer + 1);
  await page.setViewportSize({ width: 1100, height: 620 });
  await page.waitForFunction((b) => window.mentis.term.cols !== b.cols && window.mentis.term.rows !== b.rows,
    before, { timeout: 10000 });
  const after = await size();
  await type('stty size');
  await line(`${after.rows} ${after.cols}`, sawBefore + 1);
  await type('echo "hello from $(hostname) as $(whoami) in $PWD"');
  await page.waitForTimeout(500);
  await page.screenshot({ path: screenshot });
  if (elsewhere.length) throw new Error(`the page loaded from elsewhere: ${elsewhere.join(', ')}`);
  // A reload attaches to the same terminal and replays what it printed.
  const id = await page.evaluate(() => window.mentis.terminalId);
  await page.reload();
  await page.waitForFunction(() => window.mentis && window.mentis.state === 'open', null, { timeout: 30000 });
  await line('42');
  const again = await page.evaluate(() => window.mentis.terminalId);
  if (again !== id) throw new Error(`the reload opened terminal ${again}, not ${id}`);
  result = { ok: true, answer: '42', before, after, terminal: id, reattached: again === id };
} catch (e) {
  let lines = [];
  try { lines = await screen(); } catch { /* the page is gone */ }
  result = { ok: false, error: String(e), screen: lines.filter((l) => l.trim()), logs };
}
await close();
console.log(JSON.stringify(result));
process.exit(result.ok ? 0 : 1);
