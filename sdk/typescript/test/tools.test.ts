/**
 * What both frameworks' tools share, without a runtime: the cap on a tool's text (the same text as the Python
 * SDK's tools give for the same inputs), and a main entry that loads neither framework.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { clip, DEFAULT_LIMIT } from "mentis-sandbox/ai";
import { clip as langchainClip, DEFAULT_LIMIT as langchainLimit } from "mentis-sandbox/langchain";

// Inputs and what sdk/python/src/mentis/integrations/_common.py's clip(text, limit) returns for them.
const PYTHON: [text: string, limit: number, expected: string][] = [
  ["abcdefghij", 10, "abcdefghij"],
  [
    "abcdefghijk",
    10,
    "abcde\n[... 1 characters cut from the middle: the output had 11 characters, 10 are shown ...]\nghijk",
  ],
  ["abcdefghijk", 5, "ab\n[... 6 characters cut from the middle: the output had 11 characters, 5 are shown ...]\nijk"],
  [
    "héllo wörld héllo wörld héllo wörld ",
    11,
    "héllo\n[... 25 characters cut from the middle: the output had 36 characters, 11 are shown ...]\nwörld ",
  ],
  // Characters are code points: an emoji is one (two UTF-16 code units), and never split.
  [
    "😀😀😀😀😀😀😀ab🎉🎉🎉🎉🎉🎉🎉",
    9,
    "😀😀😀😀\n[... 7 characters cut from the middle: the output had 16 characters, 9 are shown ...]\n🎉🎉🎉🎉🎉",
  ],
  ["a😀b😀c😀d", 6, "a😀b\n[... 1 characters cut from the middle: the output had 7 characters, 6 are shown ...]\nc😀d"],
  ["😀😀😀😀😀😀😀😀😀😀", 10, "😀😀😀😀😀😀😀😀😀😀"],
  [
    "😀😀😀😀😀😀😀😀😀😀😀",
    10,
    "😀😀😀😀😀\n[... 1 characters cut from the middle: the output had 11 characters, 10 are shown ...]\n😀😀😀😀😀",
  ],
  // 0 or less: no limit.
  ["anything", 0, "anything"],
  ["anything", -1, "anything"],
  ["abc", 1, "\n[... 2 characters cut from the middle: the output had 3 characters, 1 are shown ...]\nc"],
  ["abcdef", 1, "\n[... 5 characters cut from the middle: the output had 6 characters, 1 are shown ...]\nf"],
];

test("the cap cuts as the Python SDK's tools cut: head and tail kept, the middle replaced by a note", () => {
  for (const [text, limit, expected] of PYTHON) {
    assert.equal(clip(text, limit), expected, `clip(${JSON.stringify(text)}, ${limit})`);
  }
  // Large numbers are written with commas, as Python's f"{n:,}".
  const long = "x".repeat(1_234_567);
  const cut = clip(long, 1001);
  assert.equal(
    cut,
    "x".repeat(500) +
      "\n[... 1,233,566 characters cut from the middle: the output had 1,234,567 characters, 1,001 are shown ...]\n" +
      "x".repeat(501),
  );
  assert.equal(cut.length, 1107);
  // The default: 20,000 characters, 10,000 each side.
  assert.equal(DEFAULT_LIMIT, 20_000);
  const text = "h".repeat(12_000) + "m".repeat(1_000) + "t".repeat(12_000);
  assert.equal(
    clip(text, DEFAULT_LIMIT),
    "h".repeat(10_000) +
      "\n[... 5,000 characters cut from the middle: the output had 25,000 characters, 20,000 are shown ...]\n" +
      "t".repeat(10_000),
  );
  assert.equal(clip(text.slice(0, 20_000), DEFAULT_LIMIT), text.slice(0, 20_000));
  // Both frameworks' entries share it.
  assert.equal(langchainClip, clip);
  assert.equal(langchainLimit, DEFAULT_LIMIT);
});

test("the main entry loads neither framework nor zod; the framework entries do", () => {
  const dir = mkdtempSync(join(tmpdir(), "mentis-entry-"));
  try {
    // A resolve hook that refuses the frameworks' packages, as if they were not installed.
    writeFileSync(
      join(dir, "hooks.mjs"),
      `const refused = /^(ai|zod|langchain)(\\/|$)|^@langchain\\//;
export async function resolve(specifier, context, next) {
  if (refused.test(specifier)) throw new Error("not installed: " + specifier);
  return next(specifier, context);
}
`,
    );
    writeFileSync(join(dir, "register.mjs"), `import { register } from "node:module";\nregister("./hooks.mjs", import.meta.url);\n`);
    const packageDir = fileURLToPath(new URL("../..", import.meta.url));
    const load = (entry: string) =>
      spawnSync(
        process.execPath,
        [
          "--import",
          pathToFileURL(join(dir, "register.mjs")).href,
          "--input-type=module",
          "-e",
          `const m = await import(${JSON.stringify(entry)}); console.log(Object.keys(m).sort().join(","));`,
        ],
        { cwd: packageDir, encoding: "utf8" },
      );

    const main = load("mentis-sandbox");
    assert.equal(main.status, 0, main.stderr);
    const names = main.stdout.trim().split(",");
    assert.ok(names.includes("Sandbox"), main.stdout);
    assert.ok(!names.some((n) => /tool|clip/i.test(n)), `the main entry exports ${main.stdout}`);

    // The check can fail: the framework entries need what the hook refuses.
    for (const [entry, missing] of [
      ["mentis-sandbox/ai", "not installed: ai"],
      ["mentis-sandbox/langchain", "not installed: @langchain/core"],
    ] as const) {
      const r = load(entry);
      assert.notEqual(r.status, 0, `${entry} loaded without its framework`);
      assert.ok(r.stderr.includes(missing), r.stderr);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
