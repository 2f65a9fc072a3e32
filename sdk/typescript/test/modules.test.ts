/**
 * The package's modules import each other without a cycle (type-only imports aside: they leave no trace at run
 * time), and the main entry loads no framework: the rule tests/module-cycles.py holds the Rust crates to.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, normalize, relative } from "node:path";
import { fileURLToPath } from "node:url";

const src = fileURLToPath(new URL("../../src", import.meta.url));

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return e.name === "gen" ? [] : sources(path);
    return e.name.endsWith(".ts") ? [path] : [];
  });
}

/** The modules of ours that `file` needs at run time. */
export function runtimeImports(file: string, text: string): string[] {
  const found: string[] = [];
  const statement = /^(?:import|export)\s+(type\s+)?([\s\S]*?)\s+from\s+"(\.[^"]+)";/gm;
  for (const m of text.matchAll(statement)) {
    const [, typeOnly, names = "", target = ""] = m;
    if (typeOnly) continue;
    const inner = names.trim().match(/^\{([\s\S]*)\}$/);
    if (inner && inner[1]!.split(",").every((n) => !n.trim() || n.trim().startsWith("type "))) continue;
    const path = normalize(join(dirname(file), target.replace(/\.js$/, ".ts")));
    if (!path.includes(`${join("src", "gen")}`)) found.push(path);
  }
  return found;
}

test("the modules import each other in no cycle", () => {
  const graph = new Map(sources(src).map((f) => [f, runtimeImports(f, readFileSync(f, "utf8"))]));
  assert.ok(graph.size > 10, `found ${graph.size} modules in ${src}`);
  const cycles: string[] = [];
  const done = new Set<string>();
  const visit = (file: string, path: string[]) => {
    if (path.includes(file)) {
      cycles.push([...path.slice(path.indexOf(file)), file].map((f) => relative(src, f)).join(" -> "));
      return;
    }
    if (done.has(file)) return;
    for (const next of graph.get(file) ?? []) visit(next, [...path, file]);
    done.add(file);
  };
  for (const file of graph.keys()) visit(file, []);
  assert.deepEqual(cycles, []);
});

test("the cycle check sees a cycle", () => {
  const a = join(src, "a.ts");
  assert.deepEqual(runtimeImports(a, 'import { b } from "./b.js";\nimport type { C } from "./c.js";\nimport { type D } from "./d.js";'), [
    join(src, "b.ts"),
  ]);
});
