import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes, randomUUID } from "node:crypto";
import { FailedPrecondition, InvalidArgument, MentisError, NotFound, Sandbox, Snapshots } from "mentis-sandbox";
import { runtime } from "./harness.js";

const sha256 = (data: Uint8Array) => createHash("sha256").update(data).digest("hex");

test("a workspace comes back in a new sandbox after its sandbox is deleted", async () => {
  await runtime();
  await using snapshots = new Snapshots();
  const blob = randomBytes(300_000);
  const conversation = `chat-${randomUUID().slice(0, 8)}`;
  let takenFrom: string;
  let snap;
  {
    await using sb = await Sandbox.create();
    await sb.files.write("notes/blob.bin", blob);
    await sb.files.write("run.sh", "#!/bin/sh\necho run\n", { mode: 0o750 });
    assert.ok((await sb.run("ln -s notes/blob.bin link && mkdir -p empty/inner")).ok);
    snap = await sb.snapshot({ labels: { conversation } });
    takenFrom = sb.id;
  }
  {
    await using gone = await Sandbox.connect(takenFrom);
    assert.equal(gone.state, "terminated");
  }
  assert.deepEqual([snap.sandboxId, snap.space, snap.labels], [takenFrom, "default", { conversation }]);
  assert.equal(snap.store, "local");
  assert.match(snap.sha256, /^[0-9a-f]{64}$/);
  assert.ok(snap.archiveBytes > blob.length && snap.sizeBytes > 0);
  assert.ok(snap.createdAt instanceof Date);
  assert.match(snap.id, /^[0-9a-f-]{36}$/);
  assert.deepEqual(await snapshots.get(snap.id), snap);

  {
    await using again = await Sandbox.create({ snapshotId: snap.id });
    assert.notEqual(again.id, takenFrom);
    assert.deepEqual(Buffer.from(await again.files.read("notes/blob.bin")), blob);
    assert.equal((await again.files.stat("run.sh")).mode & 0o777, 0o750);
    assert.equal((await again.run("./run.sh")).stdout, "run\n");
    assert.equal((await again.files.stat("link")).symlinkTarget, "notes/blob.bin");
    assert.ok((await again.files.stat("empty/inner")).isDir);
    assert.equal((await again.run("sha256sum < link")).stdout.split(" ")[0], sha256(blob));
  }
  await snapshots.delete(snap.id);
});

test("list filters by labels, sandbox and space, newest first, across pages", async () => {
  await runtime();
  await using snapshots = new Snapshots();
  const run = randomUUID().slice(0, 8);
  const taken = [];
  let elsewhere, unlabelled, sbId: string, otherId: string;
  {
    await using sb = await Sandbox.create();
    await using other = await Sandbox.create();
    sbId = sb.id;
    otherId = other.id;
    for (let i = 0; i < 4; i++) taken.push(await sb.snapshot({ labels: { run, i: String(i) } }));
    elsewhere = await other.snapshot({ labels: { run, i: "other" } });
    unlabelled = await sb.snapshot();
  }
  const newestFirst = [...taken, elsewhere].reverse().map((s) => s.id);
  const ids = async (options: Parameters<Snapshots["list"]>[0]) => (await snapshots.list(options)).map((s) => s.id);

  assert.deepEqual(await ids({ labels: { run } }), newestFirst);
  assert.deepEqual(await ids({ labels: { run }, pageSize: 2 }), newestFirst);
  assert.deepEqual(await ids({ labels: { run }, pageSize: 1 }), newestFirst);
  assert.deepEqual(await ids({ labels: { run }, limit: 1 }), newestFirst.slice(0, 1));
  assert.deepEqual(await ids({ labels: { run }, pageSize: 2, limit: 3 }), newestFirst.slice(0, 3));
  assert.deepEqual(await ids({ labels: { run, i: "2" } }), [taken[2]?.id]);
  assert.deepEqual(await ids({ labels: { run, i: "none" } }), []);
  assert.deepEqual(await ids({ sandboxId: sbId }), [unlabelled.id, ...[...taken].reverse().map((s) => s.id)]);
  assert.deepEqual(await ids({ sandboxId: otherId }), [elsewhere.id]);
  assert.deepEqual(await ids({ space: "default", labels: { run } }), newestFirst);
  assert.deepEqual((await snapshots.list({ labels: { run, i: "2" } }))[0], await snapshots.get(taken[2]?.id ?? ""));

  await assert.rejects(snapshots.list({ pageSize: -1 }), (e: unknown) => e instanceof InvalidArgument && e.field === "page_size");
  await assert.rejects(snapshots.list({ pageSize: 1.5 }), (e: unknown) => e instanceof InvalidArgument && e.field === "pageSize");
  await assert.rejects(snapshots.list({ limit: -1 }), (e: unknown) => e instanceof InvalidArgument && e.field === "limit");
  for (const s of [...taken, elsewhere, unlabelled]) await snapshots.delete(s.id);
  assert.deepEqual(await snapshots.list({ labels: { run } }), []);
});

test("delete is idempotent, a missing snapshot is NotFound, mistakes are typed", async () => {
  const rt = await runtime();
  let snap, sbId: string;
  {
    await using sb = await Sandbox.create();
    sbId = sb.id;
    snap = await sb.snapshot();
  }
  // Over a sandbox's connection: Snapshots leaves it open.
  await using sb = await Sandbox.create();
  const snapshots = new Snapshots(sb.connection);
  await snapshots.delete(snap.id);
  await assert.rejects(snapshots.get(snap.id), (e: unknown) => e instanceof NotFound && e.reason === "SNAPSHOT_NOT_FOUND");
  await snapshots.delete(snap.id); // again: no error
  await snapshots.delete(randomUUID());
  await assert.rejects(Sandbox.create({ snapshotId: snap.id }), (e: unknown) => {
    return e instanceof NotFound && e.reason === "SNAPSHOT_NOT_FOUND";
  });
  await assert.rejects(snapshots.get("not-a-snapshot-id"), (e: unknown) => {
    return e instanceof InvalidArgument && e.field === "snapshot_id";
  });
  await assert.rejects(snapshots.get(42 as unknown as string), (e: unknown) => {
    return e instanceof InvalidArgument && e.field === "snapshotId";
  });
  await assert.rejects(sb.snapshot({ labels: { n: 1 as unknown as string } }), InvalidArgument);
  // An aborted signal ends the call with its reason.
  await assert.rejects(sb.snapshot({ signal: AbortSignal.abort(new Error("not now")) }), /not now/);
  // A sandbox that no longer runs cannot be snapshotted.
  await assert.rejects(snapshots.create(sbId), MentisError);
  await snapshots.close();
  assert.ok((await sb.run("true")).ok, "the sandbox's connection was closed with the Snapshots");
  await assert.rejects(snapshots.list(), FailedPrecondition);

  // One of its own, with explicit options; a bad address is a typed error at the first call.
  await using own = new Snapshots({ addr: rt.addr, apiKey: rt.key });
  const mine = await own.create(sb.id, { labels: { own: "yes" } });
  assert.deepEqual([mine.sandboxId, mine.labels], [sb.id, { own: "yes" }]);
  await own.delete(mine.id);
  await using nowhere = new Snapshots({ addr: "ftp://nowhere" });
  await assert.rejects(nowhere.list(), MentisError);
});
