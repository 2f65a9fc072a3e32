#!/usr/bin/env python3
"""The Helm chart (helm/mentis), checked offline, since no cluster can run here: for every value set in
helm/mentis/ci/ it checks the values against values.schema.json, runs Helm's lint (strict), renders the chart
with Helm's own code (helm-python-sdk bundles Helm's Go library), checks every manifest against Kubernetes'
schemas with kubernetes-validate in strict mode (unknown fields fail), and checks what each mode must render.
Every value set in tests/helm/bad-values/ must be refused, with the message its `# expect:` line names.

ServiceMonitor is a Prometheus Operator CRD that kubernetes-validate has no schema for: it is checked against
tests/helm/servicemonitor.schema.json (ours, strict). Any other kind without a schema fails.

Run by `make lint` with the project's venv (deploy/ensure-tools.sh installs both packages); a missing tool
fails, never skips. Usage: .tools/venv/bin/python tests/helm-check.py [-v]"""
import json
import pathlib
import sys

KUBE_VERSION = "1.34.0"

try:
    import helm_python as helm
    import jsonschema
    import yaml
    from kubernetes_validate import utils as kv
except ImportError as e:
    sys.exit(f"helm-check: {e.name} is missing: deploy/ensure-tools.sh (make tools) installs it into .tools/venv")

root = pathlib.Path(__file__).resolve().parent.parent
chart_dir = root / "helm" / "mentis"
value_sets = sorted((chart_dir / "ci").glob("*-values.yaml"))
bad_sets = sorted((root / "tests" / "helm" / "bad-values").glob("*.yaml"))
monitor_schema = json.loads((root / "tests" / "helm" / "servicemonitor.schema.json").read_text())
verbose = "-v" in sys.argv[1:]
failures: list[str] = []


def fail(what: str) -> None:
    failures.append(what)
    print(f"FAIL {what}")


def render(chart, values: dict) -> dict[str, str]:
    return chart.render(values, name="mentis", namespace="sandboxes", is_install=True)


def manifests(rendered: dict[str, str]) -> list[tuple[str, dict]]:
    out = []
    for path, text in sorted(rendered.items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                out.append((path, doc))
    return out


def validate(set_name: str, path: str, doc: dict) -> None:
    name = f"{set_name}: {path}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    if doc.get("kind") == "ServiceMonitor":
        errors = list(jsonschema.Draft202012Validator(monitor_schema).iter_errors(doc))
        for e in errors:
            fail(f"{name}: {'.'.join(map(str, e.path))}: {e.message}")
        return
    try:
        kv.validate(doc, KUBE_VERSION, strict=True)
    except kv.ValidationError as e:
        fail(f"{name} against Kubernetes {e.version}: {'.'.join(map(str, e.path))}: {e.message}")
    except (kv.SchemaNotFoundError, kv.VersionNotSupportedError, kv.InvalidSchemaError) as e:
        fail(f"{name}: {e.message}")


def by_kind(docs: list[tuple[str, dict]]) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for _, doc in docs:
        kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


def container(pod: dict, name: str) -> dict | None:
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        if c["name"] == name:
            return c
    return None


def env_of(c: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def expect(set_name: str, kinds: dict[str, list[dict]]) -> None:
    """What every value set must render, and what its own mode adds."""
    def check(ok: bool, what: str) -> None:
        if not ok:
            fail(f"{set_name}: {what}")

    for kind in ["Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceAccount"]:
        check(len(kinds.get(kind, [])) >= 1, f"no {kind}")
    deploy = kinds["Deployment"][0]
    spec, pod = deploy["spec"], deploy["spec"]["template"]["spec"]
    check(spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}, "not one replica with Recreate")
    runtime = container(pod, "runtime")
    check(runtime is not None, "no runtime container")
    if runtime is None:
        return
    env = env_of(runtime)
    check(env.get("MENTIS_LISTEN") == "0.0.0.0:50051", "MENTIS_LISTEN is not 0.0.0.0:50051")
    check(env.get("MENTIS_ADMIN_KEY_FILE") == "/etc/mentis/admin-key/admin.key", "no admin key file")
    key_volume = next(v for v in pod["volumes"] if v["name"] == "admin-key")
    check(key_volume["secret"]["defaultMode"] == 0o400, "the admin key's file is not 0400")
    service = kinds["Service"][0]
    grpc_port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    check(grpc_port.get("appProtocol") == "grpc", "the Service's gRPC port has no appProtocol grpc")
    probes = [runtime.get(p) for p in ["startupProbe", "readinessProbe", "livenessProbe"]]
    tls = "MENTIS_TLS_CERT" in env
    for probe in probes:
        if tls:
            check(probe is not None and probe.get("grpc") == {"port": 50060, "service": ""},
                  "with TLS a probe does not ask the plaintext health listener (port 50060)")
            check(env.get("MENTIS_HEALTH_LISTEN") == "0.0.0.0:50060",
                  "with TLS MENTIS_HEALTH_LISTEN is not 0.0.0.0:50060")
        else:
            check(probe is not None and probe.get("grpc") == {"port": 50051, "service": ""},
                  "a probe is not Kubernetes' gRPC probe on grpc.health.v1 (service \"\")")
    dind = container(pod, "dind")
    if env.get("DOCKER_HOST") == "unix:///var/run/docker.sock":
        check(pod.get("hostNetwork") is True, "the node's socket without the node's network")
        check(dind is None, "a DinD sidecar beside the node's socket")
        check("NetworkPolicy" not in kinds, "a NetworkPolicy that cannot apply to a pod in the node's network")
    else:
        check(dind is not None and dind.get("restartPolicy") == "Always", "no native DinD sidecar")
        check(dind is not None and dind["securityContext"].get("privileged") is True, "DinD is not privileged")
        check("NetworkPolicy" in kinds, "no NetworkPolicy")
        caps = runtime["securityContext"].get("capabilities", {}).get("add", [])
        check(runtime["securityContext"].get("privileged") is True or "NET_ADMIN" in caps,
              "the runtime cannot add its iptables rule (no NET_ADMIN)")
        check(env.get("XTABLES_LOCKFILE") == env_of(dind or {}).get("XTABLES_LOCKFILE"),
              "the runtime and dockerd do not share the xtables lock")
    config = next(c for c in kinds["ConfigMap"] if c["metadata"]["name"].endswith("-config"))["data"]
    if config.get("MENTIS_DISK_LIMITS", "loop") == "loop":
        check(runtime["securityContext"].get("privileged") is True, "loop disks without a privileged runtime")
    if "MENTIS_METRICS_LISTEN" in env:
        check(any(p["name"] == "metrics" for p in service["spec"]["ports"]), "metrics on but not in the Service")
    if "MENTIS_HTTP_LISTEN" in env:
        check(any(p["name"] == "web" for p in service["spec"]["ports"]), "the web terminal on but not in the Service")
        check(any(p["name"] == "web" for p in runtime.get("ports", [])), "the web terminal on but no container port")
        if "NetworkPolicy" in kinds:
            ingress = kinds["NetworkPolicy"][0]["spec"]["ingress"]
            check(any(any(p.get("port") == "web" for p in rule.get("ports", [])) for rule in ingress),
                  "the web terminal on but the NetworkPolicy lets nobody reach it")
    else:
        check(all(p["name"] != "web" for p in service["spec"]["ports"]), "a web port in the Service while off")


def main() -> int:
    for name in ["default", "host-socket", "metrics", "tls", "resources"]:
        if not (chart_dir / "ci" / f"{name}-values.yaml").exists():
            fail(f"value set helm/mentis/ci/{name}-values.yaml is missing")
    if not bad_sets:
        fail("no value sets in tests/helm/bad-values")
    chart = helm.Chart.load(str(chart_dir))
    print(f"helm-check: Helm {helm.helm_sdk_version()} (helm-python-sdk {helm.__version__}), "
          f"kubernetes-validate against Kubernetes {KUBE_VERSION}, strict")
    counted = 0
    for value_file in value_sets:
        set_name = value_file.name
        values = helm.values_from_yaml(value_file.read_text())
        try:
            chart.validate_schema(values)
        except helm.HelmError as e:
            fail(f"{set_name}: values.schema.json refuses it: {e}")
            continue
        report = helm.lint(str(chart_dir), values, strict=True, namespace="sandboxes",
                           kube_version=f"v{KUBE_VERSION}")
        for message in report.get("messages", []):
            line = f"{set_name}: lint {message.get('path')}: {message.get('error')}"
            if message.get("severity", 0) >= 2:
                fail(line)
            elif verbose:
                print(f"note {line}")
        for error in report.get("errors") or []:
            fail(f"{set_name}: lint: {error}")
        before = len(failures)
        try:
            docs = manifests(render(chart, values))
        except helm.HelmError as e:
            fail(f"{set_name}: does not render: {e}")
            continue
        for path, doc in docs:
            validate(set_name, path, doc)
        kinds = by_kind(docs)
        expect(set_name, kinds)
        counted += len(docs)
        summary = ", ".join(f"{k} {len(v)}" if len(v) > 1 else k for k, v in sorted(kinds.items()))
        if len(failures) == before:
            print(f"ok   {set_name}: schema, lint, {len(docs)} manifests valid ({summary})")
    for value_file in bad_sets:
        lines = value_file.read_text().splitlines()
        wanted = lines[0].removeprefix("# expect:").strip() if lines and lines[0].startswith("# expect:") else ""
        if not wanted:
            fail(f"bad-values/{value_file.name}: its first line must be `# expect: <part of the message>`")
            continue
        try:
            render(chart, helm.values_from_yaml(value_file.read_text()))
            fail(f"bad-values/{value_file.name}: rendered, but must be refused ({wanted})")
        except helm.HelmError as e:
            if wanted not in str(e):
                fail(f"bad-values/{value_file.name}: refused, but not for {wanted!r}: {e}")
            else:
                print(f"ok   bad-values/{value_file.name}: refused ({wanted})")
    print(f"helm-check: {len(value_sets)} value sets rendered, {counted} manifests validated, "
          f"{len(bad_sets)} bad value sets refused" if not failures else f"helm-check: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
