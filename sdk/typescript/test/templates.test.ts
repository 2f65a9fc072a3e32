import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { gzipSync } from "node:zlib";
import {
  AlreadyExists,
  Connection,
  FailedPrecondition,
  InvalidArgument,
  NotFound,
  Sandbox,
  type Template,
  Templates,
} from "mentis-sandbox";
import { fileURLToPath } from "node:url";
import { runtime } from "./harness.js";

// The busybox test image of tests/images/build.sh (sh, no bash, no python): small sandboxes and fast builds.
const BUSYBOX = "mentis-test/busybox:1";
// The container's cgroup (v2, or v1's controllers): its memory limit in bytes, then its pids limit.
const LIMITS =
  "cd /sys/fs/cgroup; cat memory.max 2>/dev/null || cat memory/memory.limit_in_bytes; " +
  "cat pids.max 2>/dev/null || cat pids/pids.max";

const name = (what: string) => `${what}-${randomUUID().slice(0, 8)}`;

function docker(...args: string[]): string {
  const r = spawnSync("docker", args, { encoding: "utf8", maxBuffer: 64 << 20 });
  assert.equal(r.status, 0, `docker ${args.join(" ")}: ${r.stderr}`);
  return r.stdout;
}

let made = false;

/** The busybox test image, made by tests/images/build.sh with the other images of the "any image" tests (once,
 * then cached by the script), as the Python SDK's tests make it. */
function busybox(): string {
  if (!made) {
    const script = fileURLToPath(new URL("../../../../tests/images/build.sh", import.meta.url));
    const r = spawnSync(script, [], { encoding: "utf8", maxBuffer: 64 << 20 });
    assert.equal(r.status, 0, `${script} failed (${r.status}): ${r.stderr.slice(-3000)}`);
    assert.ok(r.stdout.split(/\s+/).includes(BUSYBOX), r.stdout);
    made = true;
  }
  return BUSYBOX;
}

/** Names for the images a test makes, each removed from the engine when `removeAll` is called. */
function images(instance: string) {
  const made: string[] = [];
  return {
    name(what: string): string {
      const image = `mentis-test/sdk-ts-${what}-${instance}-${randomUUID().slice(0, 6)}:1`;
      made.push(image);
      return image;
    },
    removeAll(): void {
      if (made.length) spawnSync("docker", ["image", "rm", "-f", ...made]);
    },
  };
}

/** A build context folder of `files` (path: content). */
function context(files: Record<string, string | Uint8Array>): string {
  const folder = mkdtempSync(join(tmpdir(), "mentis-ts-context-"));
  for (const [path, content] of Object.entries(files)) {
    mkdirSync(dirname(join(folder, path)), { recursive: true });
    writeFileSync(join(folder, path), content);
  }
  return folder;
}

const field = (cls: new (...a: never[]) => Error, f: string) => (e: unknown) => {
  assert.ok(e instanceof cls, String(e));
  assert.equal((e as InvalidArgument).field, f, String(e));
  return true;
};

/** The same template, times to the millisecond (what the runtime stores). */
function same(a: Template, b: Template): void {
  const ms = (d: Date | undefined) => (d ? Math.floor(d.getTime()) : undefined);
  assert.deepEqual(
    { ...a, createdAt: ms(a.createdAt), updatedAt: ms(a.updatedAt) },
    { ...b, createdAt: ms(b.createdAt), updatedAt: ms(b.updatedAt) },
  );
}

test("templates are created, got, listed across pages, updated by mask and deleted", async () => {
  const rt = await runtime();
  const admin = await Connection.open({ addr: rt.addr, apiKey: rt.key });
  // A space of this test's own, so that the listing holds its templates only.
  const space = name("tpl");
  await admin.spaces.createSpace({ space: { spaceId: space } });
  try {
    await using templates = new Templates();
    const made = await templates.create("busy", {
      space,
      image: BUSYBOX,
      description: "busybox with an app folder",
      env: { GREETING: "hello", MODE: "dev" },
      cpu: 0.5,
      memoryMb: 160,
      pids: 80,
      nofile: 512,
      workDir: "app",
      setupCommands: ["mkdir -p app", "echo ready > app/marker"],
      egressRules: [{ domain: "api.example.test" }],
    });
    assert.deepEqual(
      [made.name, made.space, made.description, made.image],
      ["busy", space, "busybox with an app folder", BUSYBOX],
    );
    assert.deepEqual([made.cpu, made.memoryMb, made.pids, made.nofile, made.diskMb], [0.5, 160, 80, 512, 0]);
    assert.deepEqual(made.env, { GREETING: "hello", MODE: "dev" });
    assert.deepEqual(made.setupCommands, ["mkdir -p app", "echo ready > app/marker"]);
    assert.deepEqual([made.workDir, made.poolSize, made.runtimeClass], ["app", 0, ""]);
    assert.deepEqual([made.egress, made.egressRules], ["rules", [{ domain: "api.example.test", ports: [80, 443] }]]);
    assert.ok(made.createdAt instanceof Date);
    same(await templates.get("busy", { space }), made);

    for (const n of ["c-three", "a-one", "b-two"]) await templates.create(n, { space });
    const names = ["a-one", "b-two", "busy", "c-three"];
    assert.deepEqual((await templates.list({ space })).map((t) => t.name), names);
    assert.deepEqual((await templates.list({ space, pageSize: 2 })).map((t) => t.name), names);
    assert.deepEqual((await templates.list({ space, pageSize: 1 })).map((t) => t.name), names);
    same((await templates.list({ space }))[2] as Template, made);

    // Only the fields given change: a limit given keeps the other limits; the rest stays as it was.
    let changed = await templates.update("busy", { description: "changed", memoryMb: 256 }, { space });
    assert.deepEqual([changed.description, changed.memoryMb], ["changed", 256]);
    assert.deepEqual([changed.cpu, changed.pids, changed.nofile], [0.5, 80, 512]);
    assert.deepEqual([changed.image, changed.env, changed.workDir], [BUSYBOX, made.env, "app"]);
    assert.deepEqual([changed.setupCommands, changed.egressRules], [made.setupCommands, made.egressRules]);
    assert.ok((changed.updatedAt?.getTime() ?? 0) > (made.updatedAt?.getTime() ?? Infinity));
    // null empties a field; rules alone keep the mode.
    changed = await templates.update(
      "busy",
      { env: { ONLY: "this" }, setupCommands: null, egressRules: [{ domain: "*.example.test", ports: [443] }] },
      { space },
    );
    assert.deepEqual([changed.env, changed.setupCommands], [{ ONLY: "this" }, []]);
    assert.deepEqual([changed.egress, changed.egressRules], ["rules", [{ domain: "*.example.test", ports: [443] }]]);
    assert.deepEqual([changed.description, changed.memoryMb, changed.workDir], ["changed", 256, "app"]);
    // All five limits given: each as given. A mode and its rules go together.
    changed = await templates.update("busy", { cpu: 0, memoryMb: 0, pids: 0, nofile: 0, diskMb: 0 }, { space });
    assert.deepEqual([changed.cpu, changed.memoryMb, changed.pids, changed.nofile, changed.diskMb], [0, 0, 0, 0, 0]);
    changed = await templates.update("busy", { egress: "deny", egressRules: null }, { space });
    assert.deepEqual([changed.egress, changed.egressRules], ["deny", []]);
    same(await templates.get("busy", { space }), changed);

    await assert.rejects(templates.update("busy", { colour: "blue" } as never, { space }), field(InvalidArgument, "colour"));
    await assert.rejects(templates.update("busy", {}, { space }), field(InvalidArgument, "changes"));
    await assert.rejects(templates.update("missing", { description: "x" }, { space }), NotFound);
    await assert.rejects(templates.update("missing", { memoryMb: 1 }, { space }), NotFound); // the read first says so
    await assert.rejects(templates.create("busy", { space }), AlreadyExists);
    await assert.rejects(templates.create("Not_A_Name", { space }), field(InvalidArgument, "template.name"));
    await assert.rejects(templates.create(name("neg"), { memoryMb: -1 }), field(InvalidArgument, "template.limits"));
    await assert.rejects(templates.create(name("half"), { memoryMb: 1.5 }), field(InvalidArgument, "memoryMb"));
    await assert.rejects(templates.create(name("pool"), { poolSize: -1 }), field(InvalidArgument, "poolSize"));
    await assert.rejects(templates.create(name("cmd"), { setupCommands: "true" as never }), field(InvalidArgument, "setupCommands"));
    await assert.rejects(templates.create(name("eg"), { egress: "open" as never }), field(InvalidArgument, "egress"));
    // A runtime class the runtime does not offer (this one offers none).
    await assert.rejects(templates.create(name("iso"), { runtimeClass: "runsc" }), (e: unknown) => {
      return e instanceof InvalidArgument && e.field === "template.runtime_class" && /offers none/.test(e.message);
    });
    await assert.rejects(templates.create("any", { space: name("nowhere") }), (e: unknown) => {
      return e instanceof NotFound && e.reason === "SPACE_NOT_FOUND";
    });

    for (const n of names) await templates.delete(n, { space });
    assert.deepEqual(await templates.list({ space }), []);
    await assert.rejects(templates.get("busy", { space }), NotFound);
    await assert.rejects(templates.delete("busy", { space }), NotFound);

    // No space: the space "default".
    const plain = name("plain");
    assert.equal((await templates.create(plain)).space, "default");
    assert.ok((await templates.list()).some((t) => t.name === plain));
    same(await templates.get(plain), await templates.get(plain, { space: "default" }));
    await templates.delete(plain);
  } finally {
    await admin.spaces.deleteSpace({ spaceId: space, force: true });
    admin.close();
  }
});

test("a sandbox made from a template has its image, env, limits, work dir and start-up commands", async () => {
  await runtime();
  busybox();
  await using templates = new Templates();
  const tpl = name("busy");
  await templates.create(tpl, {
    image: BUSYBOX,
    env: { GREETING: "hello", SHARED: "from the template" },
    memoryMb: 160,
    pids: 80,
    workDir: "app",
    setupCommands: ["mkdir -p app && echo ready > app/marker", 'echo "$GREETING" > app/greeting'],
  });
  {
    await using sb = await Sandbox.create({ template: tpl, env: { SHARED: "from the spec" } });
    assert.deepEqual([sb.info.template, sb.workDir], [tpl, "app"]);
    // The start-up commands ran before create returned, with the env; a command starts in the work dir.
    const r = await sb.run('pwd; cat marker greeting; echo "$SHARED"; readlink /proc/$$/exe');
    assert.equal(r.stdout, "/workspace/app\nready\nhello\nfrom the spec\n/bin/busybox\n", r.stderr);
    assert.equal((await sb.run(LIMITS)).stdout, `${160 * 1024 * 1024}\n80\n`);
    assert.equal((await sb.run("pwd", { cwd: "/tmp" })).stdout, "/tmp\n");
    // A template that goes later leaves its sandboxes as they are.
    await templates.delete(tpl);
    assert.equal((await sb.run("cat marker")).stdout, "ready\n");
    assert.equal((await sb.refresh()).info.template, tpl);
  }
  // A template that is not there makes nothing; a start-up command that fails fails the create.
  await assert.rejects(Sandbox.create({ template: tpl }), NotFound);
  const failing = name("failing");
  await templates.create(failing, { image: BUSYBOX, setupCommands: ["echo preparing; exit 7"] });
  try {
    await assert.rejects(Sandbox.create({ template: failing }), (e: unknown) => {
      return e instanceof FailedPrecondition && /exited with 7/.test(e.message) && /preparing/.test(e.message);
    });
  } finally {
    await templates.delete(failing);
  }
});

test("an image built from a local folder makes sandboxes, its output streams back, mistakes are typed", async () => {
  const rt = await runtime();
  busybox();
  const made = images(rt.instance);
  const folders: string[] = [];
  try {
    await using templates = new Templates();
    const folder = context({
      Dockerfile: `FROM ${BUSYBOX}\nCOPY hello.txt /srv/hello.txt\nCOPY data /srv/data\nENV BUILT=yes\n`,
      "hello.txt": "hello from the context\n",
      "data/nested/deep.txt": "deep\n",
      // 3 MB: the context goes in several messages.
      "data/blob.bin": Buffer.alloc(3_072_000, 7),
    });
    folders.push(folder);
    const tag = made.name("built");
    const output: string[] = [];
    const built = await templates.buildImage(folder, tag, { onOutput: (t) => output.push(t) });
    assert.equal(built.image, tag);
    assert.match(built.imageId, /^sha256:/);
    assert.deepEqual([built.space, built.shared], ["default", false]);
    assert.equal(docker("image", "inspect", "--format", "{{.Id}}", tag).trim(), built.imageId);
    const text = output.join("");
    assert.ok(text.includes(`: FROM ${BUSYBOX}`) && text.includes("COPY hello.txt /srv/hello.txt"), text);
    {
      const tpl = name("built");
      await templates.create(tpl, { image: built.image });
      await using sb = await Sandbox.create({ template: tpl });
      const r = await sb.run("cd /srv; cat hello.txt data/nested/deep.txt; echo $BUILT; wc -c <data/blob.bin");
      assert.equal(r.stdout, "hello from the context\ndeep\nyes\n3072000\n", r.stderr);
      await templates.delete(tpl);
    }

    // A FROM the engine does not have: refused before the build, no output.
    const missing = context({ Dockerfile: "FROM mentis-test/not-here:1\nRUN true\n" });
    folders.push(missing);
    const never = made.name("never");
    const none: string[] = [];
    await assert.rejects(templates.buildImage(missing, never, { onOutput: (t) => none.push(t) }), (e: unknown) => {
      return e instanceof FailedPrecondition && /names an image this engine does not have/.test(e.message);
    });
    assert.deepEqual(none, []);
    // A step that fails: its output first, then the error.
    const failing = context({ Dockerfile: `FROM ${BUSYBOX}\nRUN echo trying; exit 3\n` });
    folders.push(failing);
    const seen: string[] = [];
    await assert.rejects(templates.buildImage(failing, never, { onOutput: (t) => seen.push(t) }), (e: unknown) => {
      return e instanceof FailedPrecondition && /returned a non-zero code: 3/.test(e.message);
    });
    assert.ok(seen.join("").includes("trying"), seen.join(""));
    // A callback that throws ends the call, and its error is thrown.
    const refusal = new RangeError("the callback refuses");
    await assert.rejects(
      templates.buildImage(failing, never, {
        onOutput: () => {
          throw refusal;
        },
      }),
      (e: unknown) => e === refusal,
    );
    // A context that cannot be read mid-way cancels the call: its error is thrown, nothing is built.
    const broken = new Error("the disk went away");
    async function* breaking() {
      yield new Uint8Array(CHUNK_OF_TAR);
      throw broken;
    }
    const half = made.name("half");
    await assert.rejects(templates.buildImage(breaking(), half), (e: unknown) => e === broken);
    assert.notEqual(spawnSync("docker", ["image", "inspect", half]).status, 0, "an image was built of half a context");
    // Local mistakes, before any call.
    await assert.rejects(templates.buildImage(join(folder, "nowhere"), never), field(InvalidArgument, "context"));
    await assert.rejects(templates.buildImage(join(folder, "Dockerfile"), never), field(InvalidArgument, "context"));
    await assert.rejects(templates.buildImage(folder, "Not A Tag"), field(InvalidArgument, "header.image"));
    await assert.rejects(templates.buildImage(folder, never, { buildArgs: { N: 1 as never } }), field(InvalidArgument, "buildArgs"));
    const aborted = AbortSignal.abort(new Error("not now"));
    await assert.rejects(templates.buildImage(folder, never, { signal: aborted }), /not now/);
  } finally {
    made.removeAll();
    for (const f of folders) rmSync(f, { recursive: true, force: true });
  }
});

// A piece of a tar archive: the build context stream breaks after it.
const CHUNK_OF_TAR = 4096;

test("an image imported from a root filesystem tar makes sandboxes and is shared", async () => {
  const rt = await runtime();
  busybox();
  const made = images(rt.instance);
  const dir = mkdtempSync(join(tmpdir(), "mentis-ts-rootfs-"));
  const container = docker("create", BUSYBOX).trim();
  try {
    const tar = join(dir, "rootfs.tar");
    docker("export", "-o", tar, container);
    await using templates = new Templates();
    const tag = made.name("imported");
    const imported = await templates.importImage(tar, tag, { changes: ["ENV PATH=/bin", "LABEL origin=tarball"] });
    assert.equal(imported.image, tag);
    assert.match(imported.imageId, /^sha256:/);
    assert.deepEqual([imported.space, imported.shared], ["default", false]);
    assert.equal(docker("image", "inspect", "--format", '{{index .Config.Labels "origin"}}', tag).trim(), "tarball");
    {
      await using sb = await Sandbox.create({ image: tag });
      assert.equal((await sb.run("echo imported; readlink /proc/$$/exe")).stdout, "imported\n/bin/busybox\n");
    }
    // The same as gzip bytes.
    const fromBytes = await templates.importImage(gzipSync(readFileSync(tar)), made.name("gz"), { changes: ["WORKDIR /srv"] });
    assert.equal(docker("image", "inspect", "--format", "{{.Config.WorkingDir}}", fromBytes.image).trim(), "/srv");

    assert.equal((await templates.shareImage(tag)).shared, true);
    const unshared = await templates.shareImage(tag, false);
    assert.deepEqual([unshared.imageId, unshared.space, unshared.shared], [imported.imageId, "default", false]);

    // What is not a root filesystem is refused, and nothing is made of it.
    const refused = made.name("refused");
    await assert.rejects(templates.importImage(dir, refused), field(InvalidArgument, "rootfs"));
    await assert.rejects(templates.importImage(join(dir, "nowhere.tar"), refused), field(InvalidArgument, "rootfs"));
    await assert.rejects(templates.importImage(tar, refused, { changes: ["RUN rm -rf /"] }), InvalidArgument);
    // Refused at its header while the archive is still being sent: the runtime's error, typed.
    async function* slowly() {
      for (let i = 0; i < 40; i++) {
        await new Promise((r) => setTimeout(r, 10));
        yield new Uint8Array(1 << 20);
      }
    }
    await assert.rejects(templates.importImage(slowly(), refused, { changes: ["RUN rm -rf /"] }), (e: unknown) => {
      return e instanceof InvalidArgument && /not an instruction an import applies/.test(e.message);
    });
    await assert.rejects(templates.importImage(new Uint8Array(), refused), field(InvalidArgument, "data"));
    await assert.rejects(templates.shareImage("mentis-test/none-such:1"), (e: unknown) => {
      return e instanceof FailedPrecondition && e.reason === "IMAGE_MISSING";
    });
    assert.notEqual(spawnSync("docker", ["image", "inspect", refused]).status, 0);
  } finally {
    spawnSync("docker", ["rm", "-f", container]);
    made.removeAll();
    rmSync(dir, { recursive: true, force: true });
  }
});
