import { test } from "node:test";
import assert from "node:assert/strict";
import { FailedPrecondition, InvalidArgument, Sandbox } from "mentis-sandbox";
import { runtime } from "./harness.js";

const PAGE = "<h1>hello from the sandbox</h1>";
// The page in site/, a web server for it on port 8000 in the background, and a wait until it answers.
const SERVE =
  `mkdir -p site && echo '${PAGE}' > site/index.html && ` +
  "(nohup python3 -m http.server 8000 --directory site >/tmp/http.log 2>&1 &) && " +
  "for i in $(seq 100); do " +
  "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000), 1)' 2>/dev/null && exit 0; " +
  "sleep 0.1; done; cat /tmp/http.log; exit 1";

/** The status and body of a GET (an error status is an answer, not an exception). */
async function get(url: string, headers: Record<string, string> = {}): Promise<[number, string]> {
  const r = await fetch(url, { headers, signal: AbortSignal.timeout(60_000) });
  return [r.status, await r.text()];
}

test("a web server in the sandbox opens by its preview URL and stops when revoked", async () => {
  const rt = await runtime();
  await using sb = await Sandbox.create();
  const served = await sb.run(SERVE);
  assert.ok(served.ok, served.stdout + served.stderr);
  const asked = Date.now();
  const p = await sb.previewUrl(8000, { ttlMs: 600_000 });
  assert.equal(p.path, `/preview/${sb.id}/8000/?mentis_preview_token=${p.token}`);
  assert.equal(p.url, `http://${rt.httpAddr}${p.path}`);
  const left = (p.expiresAt?.getTime() ?? 0) - asked;
  assert.ok(left > 590_000 && left <= 602_000, String(left));

  // The URL as handed out opens the page; so does the token as a header, on any path of the app.
  assert.deepEqual(await get(p.url), [200, PAGE + "\n"]);
  const app = `http://${rt.httpAddr}/preview/${sb.id}/8000`;
  assert.deepEqual(await get(`${app}/index.html`, { "X-Mentis-Preview-Token": p.token }), [200, PAGE + "\n"]);
  // No token, a wrong one, or one for another port: refused.
  const [status, body] = await get(`${app}/`);
  assert.equal(status, 401);
  assert.ok(body.includes("no preview token"), body);
  assert.equal((await get(`${app}/`, { "X-Mentis-Preview-Token": p.token.slice(0, -4) + "AAAA" }))[0], 403);
  const other = await sb.previewUrl(8001);
  assert.equal((await get(`${app}/`, { "X-Mentis-Preview-Token": other.token }))[0], 403);

  // Revoking port 8000 ends its URLs handed out so far, not another port's; a new one works.
  await sb.revokePreviewUrls(8000);
  const [revoked, why] = await get(p.url);
  assert.equal(revoked, 401);
  assert.ok(why.includes("revoked"), why);
  const to8001 = `http://${rt.httpAddr}/preview/${sb.id}/8001/`;
  const [nothing, said] = await get(to8001, { "X-Mentis-Preview-Token": other.token });
  assert.equal(nothing, 502);
  assert.ok(said.includes("nothing answers on port 8001"), said);
  const again = await sb.previewUrl(8000);
  assert.deepEqual(await get(again.url), [200, PAGE + "\n"]);
  // Revoking every port's ends that one too.
  await sb.revokePreviewUrls();
  assert.equal((await get(again.url))[0], 401);
  assert.equal((await get(to8001, { "X-Mentis-Preview-Token": other.token }))[0], 401);
  assert.deepEqual(await get((await sb.previewUrl(8000)).url), [200, PAGE + "\n"]);
});

test("bad ports and TTLs are InvalidArgument; an ended sandbox has no ports", async () => {
  await runtime();
  let gone: string;
  {
    await using sb = await Sandbox.create();
    gone = sb.id;
    for (const port of [0, 65536, 50052]) {
      await assert.rejects(sb.previewUrl(port), (e: unknown) => e instanceof InvalidArgument && e.field === "port");
    }
    await assert.rejects(sb.previewUrl(8000, { ttlMs: 8 * 24 * 3600_000 }), (e: unknown) => {
      return e instanceof InvalidArgument && e.field === "ttl_seconds";
    });
    // What no request can carry, refused before one is sent.
    for (const port of [-1, 2 ** 32, "8000", 8000.5, true, null]) {
      await assert.rejects(sb.previewUrl(port as number), (e: unknown) => e instanceof InvalidArgument && e.field === "port");
    }
    await assert.rejects(sb.revokePreviewUrls(0), (e: unknown) => e instanceof InvalidArgument && e.field === "port");
    await assert.rejects(sb.previewUrl(8000, { ttlMs: -5 }), (e: unknown) => e instanceof InvalidArgument && e.field === "ttlMs");
    // A fraction of a second is rounded up, never to 0 (an hour).
    const short = await sb.previewUrl(8000, { ttlMs: 1500 });
    assert.ok((short.expiresAt?.getTime() ?? Infinity) - Date.now() <= 3000);
  }
  await using ended = await Sandbox.connect(gone);
  await assert.rejects(ended.previewUrl(8000), (e: unknown) => e instanceof FailedPrecondition && e.reason === "SANDBOX_ENDED");
});
