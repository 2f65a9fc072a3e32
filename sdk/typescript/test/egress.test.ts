import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { Connection, type EgressRule, InvalidArgument, NotFound, Sandbox, Secrets } from "mentis-sandbox";
import { runtime } from "./harness.js";

// A name no rule allows: the gateway answers nothing for it and keeps the refusal.
const DENIED = "nothing.example.test";

const secretName = () => `TOKEN_${randomUUID().slice(0, 8).toUpperCase()}`;

/** A check that a call was refused with InvalidArgument naming `field`. */
const invalid = (field: string) => (e: unknown) => {
  assert.ok(e instanceof InvalidArgument, String(e));
  assert.equal(e.field, field, String(e));
  return true;
};

test("a sandbox made with rules reports them, changes them, and its refusals are read back", async () => {
  await runtime();
  const token = secretName();
  await using secrets = new Secrets();
  await secrets.set(token, "tok-2718");
  try {
    const rules: EgressRule[] = [
      { domain: "api.example.test", ports: [443], headers: { Authorization: `Bearer {secret:${token}}` } },
      { cidr: "203.0.113.0/24", ports: [8080, 22] },
    ];
    await using sb = await Sandbox.create({ egressRules: rules }); // rules alone: egress "rules"
    // As given, the ports in order; the header's value as written, never the secret's.
    const kept: EgressRule[] = [
      { domain: "api.example.test", ports: [443], headers: { Authorization: `Bearer {secret:${token}}` } },
      { cidr: "203.0.113.0/24", ports: [22, 8080] },
    ];
    assert.deepEqual([sb.info.egress, sb.info.egressRules], ["rules", kept]);
    {
      await using again = await Sandbox.connect(sb.id);
      assert.deepEqual([again.info.egress, again.info.egressRules], ["rules", kept]);
    }
    const r = await sb.run(`curl -sS https://${DENIED}/ || true`);
    assert.ok(r.stderr.includes(`Could not resolve host: ${DENIED}`), r.stderr);
    assert.ok(!(await sb.run("env")).stdout.includes("tok-2718"));
    // The gateway keeps a refusal before it answers: it is there once the command ended.
    const denials = await sb.egressDenials();
    const refused = denials.filter((d) => d.protocol === "dns" && d.name === DENIED);
    assert.ok(refused.length, JSON.stringify(denials));
    assert.ok(refused[0]?.time instanceof Date);
    assert.ok(refused[0]?.reason.includes(DENIED), refused[0]?.reason);

    // New rules while it runs: a name with no ports gets 443 and 80; the sandbox's info follows.
    const got = await sb.updateEgressRules([{ domain: "*.example.test" }]);
    assert.deepEqual(got, [{ domain: "*.example.test", ports: [80, 443] }]);
    assert.deepEqual([sb.info.egressRules, sb.info.egress], [got, "rules"]);
    assert.deepEqual((await sb.refresh()).info.egressRules, got);

    // A bad rule is refused, naming it; the rules stay as they were.
    await assert.rejects(
      sb.updateEgressRules([{ domain: "ok.example.test" }, { domain: "*" }]),
      invalid("sandbox.egress_rules[1].domain"),
    );
    assert.deepEqual((await sb.refresh()).info.egressRules, got);
    assert.deepEqual(await sb.updateEgressRules([]), []);
    await sb.refresh();
    assert.deepEqual([sb.info.egress, sb.info.egressRules], ["rules", []]);
  } finally {
    await secrets.delete(token);
  }
});

test("egress mistakes are refused before any call or as typed errors", async () => {
  await runtime();
  // What no request can carry: refused here, naming the option.
  for (const bad of ["sometimes", "", "EGRESS_RULES"]) {
    await assert.rejects(Sandbox.create({ egress: bad as "deny" }), (e: unknown) => {
      assert.ok(e instanceof InvalidArgument && e.field === "egress", String(e));
      assert.ok(['"deny"', '"allow"', '"rules"'].every((m) => e.message.includes(m)), e.message);
      return true;
    });
  }
  await assert.rejects(Sandbox.create({ egressRules: [null as unknown as EgressRule] }), invalid("egressRules[0]"));
  await assert.rejects(Sandbox.create({ egressRules: [{ domain: "a.example.test", ports: [1.5] }] }), invalid("egressRules[0].ports"));
  await assert.rejects(Sandbox.create({ egressRules: "api.example.test" as unknown as EgressRule[] }), invalid("egressRules"));

  // Rules the runtime refuses, with the field at fault.
  await assert.rejects(Sandbox.create({ egressRules: [{ domain: "*" }] }), invalid("spec.egress_rules[0].domain"));
  await assert.rejects(
    Sandbox.create({ egress: "rules", egressRules: [{ domain: "a.example.test", cidr: "10.0.0.0/8" }] }),
    invalid("spec.egress_rules[0]"),
  );
  await assert.rejects(
    Sandbox.create({ egressRules: [{ domain: "a.example.test", headers: { "X-Token": "{secret:NO_SUCH_SECRET}" } }] }),
    invalid("spec.egress_rules[0].headers"),
  );
  await assert.rejects(
    Sandbox.create({ egress: "deny", egressRules: [{ domain: "a.example.test" }] }),
    invalid("spec.egress_rules"),
  );

  // Rules alone do not change a mode: a sandbox made with "deny" takes rules with updateEgress only.
  await using sb = await Sandbox.create({ egress: "deny" });
  assert.deepEqual([sb.info.egress, sb.info.egressRules], ["deny", []]);
  await assert.rejects(sb.updateEgressRules([{ domain: "api.example.test" }]), invalid("sandbox.egress_rules"));
  await sb.refresh();
  assert.deepEqual([sb.info.egress, sb.info.egressRules], ["deny", []]);
  assert.deepEqual(await sb.egressDenials(), []);
  assert.equal(await sb.updateEgress("rules", [{ domain: "api.example.test" }]), sb);
  assert.deepEqual([sb.info.egress, sb.info.egressRules.map((r) => r.domain)], ["rules", ["api.example.test"]]);
  await sb.run("curl -sS --max-time 5 https://elsewhere.example.test/ || true");
  // (One refusal per DNS question: A and AAAA.)
  assert.deepEqual(new Set((await sb.egressDenials()).map((d) => `${d.protocol} ${d.name}`)), new Set(["dns elsewhere.example.test"]));
  await sb.updateEgress("allow");
  assert.deepEqual([sb.info.egress, sb.info.egressRules], ["allow", []]);
  await assert.rejects(sb.updateEgress("open" as "allow"), invalid("egress"));
  await assert.rejects(sb.updateEgressRules(undefined as unknown as EgressRule[]), invalid("rules"));
  await assert.rejects(sb.updateEgress("rules", [{ domain: 7 as unknown as string }]), invalid("rules[0].domain"));
  assert.equal((await (await sb.updateEgress("deny")).refresh()).info.egress, "deny");
});

test("secrets are set, listed by name only and deleted", async () => {
  const rt = await runtime();
  const space = `secrets-${randomUUID().slice(0, 8)}`;
  const admin = await Connection.open({ addr: rt.addr, apiKey: rt.key });
  try {
    await admin.spaces.createSpace({ space: { spaceId: space } });
    await using defaults = new Secrets({ connection: admin });
    await using secrets = new Secrets({ space });
    assert.equal(secrets.space, space);
    assert.deepEqual(await secrets.list(), []);
    await secrets.set("B_TOKEN", "second");
    await secrets.set("A_TOKEN", "first");
    await secrets.set("A_TOKEN", "replaced"); // made or replaced
    assert.deepEqual(await secrets.list(), ["A_TOKEN", "B_TOKEN"]); // names, in name order
    assert.ok(!(await defaults.list()).includes("A_TOKEN")); // another space's
    // A rule of a sandbox of that space may name it.
    {
      const rule = { domain: "api.example.test", headers: { Authorization: "Bearer {secret:A_TOKEN}" } };
      await using sb = await Sandbox.create({ space, egressRules: [rule] });
      assert.deepEqual(sb.info.egressRules[0]?.headers, { Authorization: "Bearer {secret:A_TOKEN}" });
    }
    await secrets.delete("B_TOKEN");
    assert.deepEqual(await secrets.list(), ["A_TOKEN"]);
    await assert.rejects(secrets.delete("B_TOKEN"), NotFound);
    await assert.rejects(secrets.set("1-not a name", "x"), invalid("name"));
    await assert.rejects(secrets.set("C_TOKEN", "line\nbreak"), invalid("value"));
    await assert.rejects(secrets.set("C_TOKEN", 5 as unknown as string), invalid("value"));
    await secrets.delete("A_TOKEN");
    assert.deepEqual(await secrets.list(), []);
    await using nowhere = new Secrets({ space: `no-space-${randomUUID().slice(0, 8)}` });
    await assert.rejects(nowhere.list(), NotFound);
  } finally {
    await admin.spaces.deleteSpace({ spaceId: space, force: true });
    admin.close();
  }
});
