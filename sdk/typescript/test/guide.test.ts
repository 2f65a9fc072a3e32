/** docs/SDK-TS.md's TypeScript blocks, compiled and run as written against a real runtime. */
import { before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { runtime } from "./harness.js";

const packageDir = fileURLToPath(new URL("../..", import.meta.url));
const guide = readFileSync(new URL("../../../../docs/SDK-TS.md", import.meta.url), "utf8");
const blocks = [...guide.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1] ?? "");
// Inside the package's folder, so that `mentis-sandbox` resolves to the package itself.
const dir = `${packageDir}build/guide`;

/** What each block prints, in the guide's order. */
const expected: string[][] = [
  ["3 hi", "42", "hello [ 'notes/a.txt' ]"],
  ["live: step 1", "live: step 2", "live: step 3", "4 exited", "cancelled"],
  ["created out/sum.txt", "3", "137"],
  ["true", "3", "kept", "guide ready"],
  ["NOT_FOUND SANDBOX_NOT_FOUND"],
  [`the model was sent: ${JSON.stringify({ type: "text", value: "status: ok\n--- result ---\n42" })}`],
  ["exit code: 0", "--- stdout ---", "42"],
];

before(async () => {
  await runtime();
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  blocks.forEach((code, i) => writeFileSync(`${dir}/block${i}.ts`, code));
  // Compiled as the README compiles its quick start.
  execFileSync(
    process.execPath,
    [
      `${packageDir}node_modules/typescript/bin/tsc`,
      ...["--module", "nodenext", "--target", "es2022", "--lib", "es2022,esnext.disposable"],
      ...["--types", "node", "--skipLibCheck", "--strict", "--rootDir", dir, "--outDir", dir],
      ...blocks.map((_, i) => `${dir}/block${i}.ts`),
    ],
    { stdio: "inherit" },
  );
});

test("the guide has the blocks this test knows", () => {
  assert.equal(blocks.length, expected.length);
});

for (const [i, lines] of expected.entries()) {
  test(`docs/SDK-TS.md's block ${i + 1} prints what the guide says`, () => {
    const preload = i === 5 ? ["--import", fileURLToPath(new URL("./guide-model.js", import.meta.url))] : [];
    const r = spawnSync(process.execPath, [...preload, `${dir}/block${i}.js`], { encoding: "utf8", cwd: dir });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(r.stdout.trimEnd().split("\n"), lines, r.stderr);
  });
}
