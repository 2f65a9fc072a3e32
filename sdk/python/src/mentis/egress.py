"""Egress rules (what a sandbox may reach) and the space secrets their headers name, the synchronous API.

    from mentis import EgressRule, Sandbox, Secrets

    with Secrets() as secrets:
        secrets.set("API_TOKEN", "tok-3141")           # sealed in the runtime's store; never returned
    rule = EgressRule(domain="api.example.com", ports=[443],
                      headers={"Authorization": "Bearer {secret:API_TOKEN}"})
    with Sandbox.create(egress_rules=[rule]) as sb:    # rules alone: egress "rules"
        sb.run("curl -sS https://api.example.com/user")  # the gateway sets the header, unseen here
        print(sb.egress_denials())                     # what the gateway refused it

A sandbox's egress is `"deny"` (no route out), `"allow"` (any route out) or `"rules"` (only what its rules
allow, through the runtime's egress gateway, which also answers its DNS). Both change while it runs: its
rules (`Sandbox.update_egress_rules`) and, while it is RUNNING, its mode (`Sandbox.update_egress`).
docs/EGRESS.md is the guide.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import grpc
from google.protobuf import field_mask_pb2

from ._client import Connection, Settings
from .errors import from_rpc_error
from .terminal import _time
from .v1 import sandbox_pb2, space_pb2

__all__ = ["EgressDenial", "EgressRule", "Secrets"]

# The egress modes `Sandbox.create(egress=...)` takes, by name.
_MODES = {
    "deny": sandbox_pb2.EGRESS_DENY,
    "allow": sandbox_pb2.EGRESS_ALLOW,
    "rules": sandbox_pb2.EGRESS_RULES,
}


@dataclass
class EgressRule:
    """One destination a sandbox with egress `"rules"` may reach: exactly one of `domain` (a host name,
    `"api.example.com"`, or every name under one, `"*.example.com"`, not that name itself; matched against
    each connection's TLS server name or HTTP Host) and `cidr` (an IPv4 network, `"203.0.113.0/24"`).
    `ports` are the TCP ports it allows (empty: 443 and 80; a sandbox's rules report them filled in).
    `headers` (domain rules only) are set by the egress gateway on every HTTP request to that name,
    replacing the sandbox's own: `"{secret:NAME}"` in a value is the space's secret NAME (`Secrets`), which
    never enters the sandbox; a sandbox's rules report the value as written, never the secret's."""

    domain: str = ""
    cidr: str = ""
    ports: list[int] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Any sequence of ports and mapping of headers is taken; kept as a list and a dict, so that rules
        # compare equal however they were written.
        self.ports = list(self.ports)
        self.headers = dict(self.headers)


@dataclass
class EgressDenial:
    """A connection or DNS question the egress gateway refused a sandbox: `protocol` is `"tcp"`, `"dns"` or
    `"http"`; `name` the name asked for or sent (DNS, TLS server name, HTTP Host), when there was one;
    `address` the address and port it was for (`"203.0.113.7:22"`), when there was one; `reason` why, in
    words (`"no rule allows api.example.com"`)."""

    time: datetime | None
    protocol: str
    name: str = ""
    address: str = ""
    reason: str = ""


def _egress_mode(egress: str | None, has_rules: bool) -> int:
    """The Egress value of `create(egress=..., egress_rules=...)`: None is the template's, space's or
    runtime's default, unless rules are given (rules alone ask for `"rules"`). An unknown mode is refused
    here, before any call (ValueError)."""
    if egress is None:
        return sandbox_pb2.EGRESS_RULES if has_rules else sandbox_pb2.EGRESS_UNSPECIFIED
    mode = _MODES.get(egress.strip().lower()) if isinstance(egress, str) else None
    if mode is None:
        allowed = ", ".join(repr(m) for m in _MODES)
        raise ValueError(f"egress must be one of {allowed} (or None: the default), not {egress!r}")
    return mode


def _rule_message(rule: EgressRule) -> sandbox_pb2.EgressRule:
    if not isinstance(rule, EgressRule):
        raise TypeError(f"an egress rule is an EgressRule, not {type(rule).__name__}")
    return sandbox_pb2.EgressRule(
        domain=rule.domain,
        cidr=rule.cidr,
        ports=builtins.list(rule.ports),
        headers=[sandbox_pb2.EgressHeader(name=k, value=v) for k, v in rule.headers.items()],
    )


def _rule_messages(rules: Iterable[EgressRule] | None) -> builtins.list[sandbox_pb2.EgressRule]:
    return [_rule_message(r) for r in rules or ()]


def _rule(r: sandbox_pb2.EgressRule) -> EgressRule:
    return EgressRule(
        domain=r.domain,
        cidr=r.cidr,
        ports=builtins.list(r.ports),
        headers={h.name: h.value for h in r.headers},
    )


def _denial(d: sandbox_pb2.EgressDenial) -> EgressDenial:
    return EgressDenial(
        time=_time(d.time), protocol=d.protocol, name=d.name, address=d.address, reason=d.reason
    )


def _update_rules_request(sandbox_id: str, rules: Iterable[EgressRule]) -> sandbox_pb2.UpdateSandboxRequest:
    """UpdateSandbox's request that gives a sandbox these rules (the mask's `egress_rules` only)."""
    return sandbox_pb2.UpdateSandboxRequest(
        sandbox=sandbox_pb2.Sandbox(sandbox_id=sandbox_id, egress_rules=_rule_messages(rules)),
        update_mask=field_mask_pb2.FieldMask(paths=["egress_rules"]),
    )


def _mode_request(
    sandbox_id: str, egress: str, rules: Iterable[EgressRule] | None
) -> sandbox_pb2.UpdateSandboxRequest:
    """UpdateSandbox's request that gives a sandbox another mode and these rules (both in the mask)."""
    return sandbox_pb2.UpdateSandboxRequest(
        sandbox=sandbox_pb2.Sandbox(
            sandbox_id=sandbox_id,
            egress=_egress_mode(egress, False),
            egress_rules=_rule_messages(rules),
        ),
        update_mask=field_mask_pb2.FieldMask(paths=["egress", "egress_rules"]),
    )


def _set_request(space_id: str | None, name: str, value: str) -> space_pb2.SetSecretRequest:
    return space_pb2.SetSecretRequest(space_id=space_id or "", name=name, value=value)


def _delete_request(space_id: str | None, name: str) -> space_pb2.DeleteSecretRequest:
    return space_pb2.DeleteSecretRequest(space_id=space_id or "", name=name)


class Secrets:
    """The secrets of a space (`space_id` None: the space `default`): values the egress gateway puts into
    the headers of its sandboxes' requests where a rule names them (`"{secret:NAME}"`), and that never enter
    a sandbox. `set`, `list` (names only: no call returns a value) and `delete`. Opens a connection of its
    own (the same `addr`, `api_key` and `tls` rules as `Sandbox.create`); used as a context manager it is
    closed at the end of the block. A key scoped to spaces manages its spaces' secrets only
    (PermissionDenied otherwise)."""

    def __init__(
        self,
        *,
        space_id: str | None = None,
        addr: str | None = None,
        api_key: str | None = None,
        tls: bool | None = None,
    ):
        self.space_id = space_id or ""
        self._conn = Connection(Settings.resolve(addr, api_key, tls=tls))

    def _call(self, method_name: str, request: Any):
        try:
            return getattr(self._conn.spaces, method_name)(request)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def set(self, name: str, value: str) -> None:
        """Sets secret `name` (letters, digits and '_', not starting with a digit, at most 64) to `value` (at
        most 4096 bytes, no control characters: it goes into HTTP headers), made or replaced; sandboxes'
        next requests get the new value. InvalidArgument (with its `field`) for a name or value the runtime
        refuses, NotFound when the space is unknown."""
        self._call("SetSecret", _set_request(self.space_id, name, value))

    def list(self) -> builtins.list[str]:
        """The names of the space's secrets, in name order (never their values)."""
        request = space_pb2.ListSecretsRequest(space_id=self.space_id)
        return builtins.list(self._call("ListSecrets", request).names)

    def delete(self, name: str) -> None:
        """Removes secret `name`; requests of rules that name it are then refused by the gateway. NotFound
        when the space has no such secret."""
        self._call("DeleteSecret", _delete_request(self.space_id, name))

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Secrets:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
