"""Egress rules and space secrets with the synchronous API, against a real runtime and real sandboxes (the
runtime's egress gateway on the Docker engine): a sandbox made with rules reports them, gets new ones while it
runs, and its refusals are read back; mistakes are typed errors (or ValueError before any call); secrets are
set, listed by name only and deleted. The asyncio twins are in test_async.py."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
from mentis.v1 import space_pb2

import mentis
import mentis.sandbox
from mentis import EgressDenial, EgressRule, Sandbox, Secrets

# A name no rule allows: the gateway answers nothing for it and keeps the refusal.
DENIED = "nothing.example.test"


def _secret_name() -> str:
    return f"TOKEN_{uuid.uuid4().hex[:8].upper()}"


def test_a_sandbox_made_with_rules_reports_them_changes_them_and_its_refusals_are_read_back(env):
    token = _secret_name()
    with Secrets() as secrets:
        secrets.set(token, "tok-2718")
        try:
            rules = [
                EgressRule(
                    domain="api.example.test",
                    ports=[443],
                    headers={"Authorization": f"Bearer {{secret:{token}}}"},
                ),
                EgressRule(cidr="203.0.113.0/24", ports=(8080, 22)),
            ]
            with Sandbox.create(egress_rules=rules) as sb:  # rules alone: egress "rules"
                # As given, the ports in order; the header's value as written, never the secret's.
                kept = [
                    EgressRule(
                        domain="api.example.test",
                        ports=[443],
                        headers={"Authorization": f"Bearer {{secret:{token}}}"},
                    ),
                    EgressRule(cidr="203.0.113.0/24", ports=[22, 8080]),
                ]
                assert (sb.egress, sb.egress_rules) == ("rules", kept)
                again = Sandbox.connect(sb.id)
                assert (again.egress, again.egress_rules) == ("rules", kept)
                again.close()

                r = sb.run(f"curl -sS https://{DENIED}/ || true")
                assert f"Could not resolve host: {DENIED}" in r.stderr, r
                assert "tok-2718" not in sb.run("env").stdout
                # The gateway keeps a refusal before it answers: it is there once the command ended.
                denials = sb.egress_denials()
                assert all(isinstance(d, EgressDenial) for d in denials)
                refused = [d for d in denials if d.protocol == "dns" and d.name == DENIED]
                assert refused, denials
                assert isinstance(refused[0].time, datetime) and refused[0].time.tzinfo == timezone.utc
                assert refused[0].reason and DENIED in refused[0].reason, refused[0]

                # New rules while it runs: a name with no ports gets 443 and 80; the sandbox's info follows.
                got = sb.update_egress_rules([EgressRule(domain="*.example.test")])
                assert got == [EgressRule(domain="*.example.test", ports=[80, 443])]
                assert sb.egress_rules == got and sb.egress == "rules"
                assert sb.refresh().egress_rules == got

                # A bad rule is refused, naming it; the rules stay as they were.
                with pytest.raises(mentis.InvalidArgument) as bad:
                    sb.update_egress_rules([EgressRule(domain="ok.example.test"), EgressRule(domain="*")])
                assert bad.value.field == "sandbox.egress_rules[1].domain", bad.value
                assert sb.refresh().egress_rules == got

                assert sb.update_egress_rules([]) == []
                assert (sb.refresh().egress, sb.egress_rules) == ("rules", [])
        finally:
            secrets.delete(token)


def test_egress_mistakes_are_refused_before_any_call_or_as_typed_errors(env, monkeypatch):
    # An unknown mode: ValueError naming the modes, before a connection is even made.
    def no_connection(*args, **kwargs):
        raise AssertionError("a connection was made")

    with monkeypatch.context() as m:
        m.setattr(mentis.sandbox, "Connection", no_connection)
        for bad in ("sometimes", "", "EGRESS_RULES"):
            with pytest.raises(ValueError) as wrong:
                Sandbox.create(egress=bad)
            assert all(mode in str(wrong.value) for mode in ("'deny'", "'allow'", "'rules'")), wrong.value
        with pytest.raises(ValueError):
            Sandbox.get_or_create(key="k", egress="open")
        with pytest.raises(TypeError):
            Sandbox.create(egress_rules=[{"domain": "api.example.test"}])

    # Rules the runtime refuses, with the field at fault.
    with pytest.raises(mentis.InvalidArgument) as lone:
        Sandbox.create(egress_rules=[EgressRule(domain="*")])
    assert lone.value.field == "spec.egress_rules[0].domain", lone.value
    with pytest.raises(mentis.InvalidArgument) as both:
        Sandbox.create(egress="rules", egress_rules=[EgressRule(domain="a.example.test", cidr="10.0.0.0/8")])
    assert both.value.field == "spec.egress_rules[0]", both.value
    with pytest.raises(mentis.InvalidArgument) as missing:
        rule = EgressRule(domain="a.example.test", headers={"X-Token": "{secret:NO_SUCH_SECRET}"})
        Sandbox.create(egress_rules=[rule])
    assert missing.value.field == "spec.egress_rules[0].headers", missing.value
    with pytest.raises(mentis.InvalidArgument) as not_rules:
        Sandbox.create(egress="deny", egress_rules=[EgressRule(domain="a.example.test")])
    assert not_rules.value.field == "spec.egress_rules", not_rules.value

    # Rules alone do not change a mode: a sandbox made with "deny" takes rules with update_egress only.
    with Sandbox.create(egress="DENY") as sb:
        assert (sb.egress, sb.egress_rules) == ("deny", [])
        with pytest.raises(mentis.InvalidArgument) as no_rules:
            sb.update_egress_rules([EgressRule(domain="api.example.test")])
        assert no_rules.value.field == "sandbox.egress_rules", no_rules.value
        assert (sb.refresh().egress, sb.egress_rules) == ("deny", [])
        assert sb.egress_denials() == []
        sb.update_egress("rules", [EgressRule(domain="api.example.test")])
        assert (sb.egress, [r.domain for r in sb.egress_rules]) == ("rules", ["api.example.test"])
        sb.run("curl -sS --max-time 5 https://elsewhere.example.test/ || true")
        assert {(d.protocol, d.name) for d in sb.egress_denials()} == {("dns", "elsewhere.example.test")}
        assert (sb.update_egress("allow").egress, sb.egress_rules) == ("allow", [])
        with pytest.raises(ValueError):
            sb.update_egress("open")
        assert sb.update_egress("deny").refresh().egress == "deny"


def test_secrets_are_set_listed_by_name_only_and_deleted(env):
    with Secrets() as default:
        space = f"secrets-{uuid.uuid4().hex[:8]}"
        default._conn.spaces.CreateSpace(space_pb2.CreateSpaceRequest(space=space_pb2.Space(space_id=space)))
        with Secrets(space_id=space) as secrets:
            assert secrets.list() == []
            secrets.set("B_TOKEN", "second")
            secrets.set("A_TOKEN", "first")
            secrets.set("A_TOKEN", "replaced")  # made or replaced
            assert secrets.list() == ["A_TOKEN", "B_TOKEN"]  # names, in name order
            assert "A_TOKEN" not in default.list()  # another space's
            # A rule of a sandbox of that space may name it.
            rule = EgressRule(domain="api.example.test", headers={"Authorization": "Bearer {secret:A_TOKEN}"})
            with Sandbox.create(space=space, egress_rules=[rule]) as sb:
                assert sb.egress_rules[0].headers == {"Authorization": "Bearer {secret:A_TOKEN}"}
            secrets.delete("B_TOKEN")
            assert secrets.list() == ["A_TOKEN"]
            with pytest.raises(mentis.NotFound):
                secrets.delete("B_TOKEN")
            with pytest.raises(mentis.InvalidArgument) as bad_name:
                secrets.set("1-not a name", "x")
            assert bad_name.value.field == "name", bad_name.value
            with pytest.raises(mentis.InvalidArgument) as bad_value:
                secrets.set("C_TOKEN", "line\nbreak")
            assert bad_value.value.field == "value", bad_value.value
            secrets.delete("A_TOKEN")
            assert secrets.list() == []
        with Secrets(space_id=f"no-space-{uuid.uuid4().hex[:8]}") as nowhere, pytest.raises(mentis.NotFound):
            nowhere.list()


def test_the_guides_egress_example_runs_as_written(env, capsys):
    from test_sync import _python_blocks

    (block,) = _python_blocks("docs/SDK.md", "egress")
    exec(compile(block, "docs/SDK.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["rules ['api.example.test']", "['*.example.test']"], out
    assert f"dns {DENIED}: no rule allows {DENIED}" in out[2:-1], out
    assert out[-1] == "['API_TOKEN']", out
