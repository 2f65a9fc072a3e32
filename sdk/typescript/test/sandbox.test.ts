import { test } from "node:test";
import assert from "node:assert/strict";
import { Sandbox } from "mentis-sandbox";
import { runtime } from "./harness.js";

test("a command gives its exit code, streams and live output", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  const seen: string[] = [];
  const r = await sb.run("echo out; echo err >&2; exit 3", { onStdout: (t) => seen.push(t) });
  assert.equal(r.exitCode, 3);
  assert.equal(r.reason, "exited");
  assert.equal(r.stdout, "out\n");
  assert.equal(r.stderr, "err\n");
  assert.equal(r.ok, false);
  assert.equal(seen.join(""), "out\n");
});
