#!/usr/bin/env python3
"""The Helm chart (helm/mentis), checked offline, since no cluster can run here: for every value set in
helm/mentis/ci/ it checks the values against values.schema.json, runs Helm's lint (strict), renders the chart
with Helm's own code (helm-python-sdk bundles Helm's Go library), checks every manifest against Kubernetes'
schemas with kubernetes-validate in strict mode (unknown fields fail), and checks what each mode must render:
backend docker (a Docker-in-Docker sidecar, or the node's socket) and backend kubernetes (nothing of Docker, the
runtime under Pod Security restricted, its Role exactly what the backend uses, in the sandbox namespace).
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


RELEASE_NAMESPACE = "sandboxes"


def render(chart, values: dict) -> dict[str, str]:
    return chart.render(values, name="mentis", namespace=RELEASE_NAMESPACE, is_install=True)


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


# The Role of backend kubernetes, rule by rule: (API group, resource, verb). Exactly these, nothing more: no
# get, list or watch of Secrets (the runtime never reads one back), no wildcard.
SANDBOX_ROLE = {("", "pods", v) for v in ["create", "get", "list", "watch", "delete"]} | {
    ("", "pods/resize", "patch"),
    ("", "secrets", "create"),
    ("", "secrets", "delete"),
} | {("networking.k8s.io", "networkpolicies", v) for v in ["get", "create", "patch"]}
CLAIMS_ROLE = {("", "persistentvolumeclaims", v) for v in ["create", "get", "delete"]}
# Pod Security Standards, restricted (Kubernetes 1.34): the volume types it allows.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def restricted_violations(pod: dict) -> list[str]:
    """What in pod spec `pod` the Pod Security Standard `restricted` (baseline's checks included) refuses."""
    out = []
    psc = pod.get("securityContext", {})
    for key in ["hostNetwork", "hostPID", "hostIPC"]:
        if pod.get(key):
            out.append(f"{key}")
    for v in pod.get("volumes", []):
        kind = next(k for k in v if k != "name")
        if kind not in RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']} is {kind}")
    if psc.get("runAsUser") == 0:
        out.append("the pod's runAsUser is 0")
    if psc.get("sysctls"):
        out.append("sysctls")
    pod_seccomp = psc.get("seccompProfile", {}).get("type")
    for c in pod.get("initContainers", []) + pod.get("containers", []):
        sc, name = c.get("securityContext", {}), c["name"]
        if sc.get("privileged"):
            out.append(f"{name} is privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name} does not set allowPrivilegeEscalation false")
        if not (sc.get("runAsNonRoot") is True or (psc.get("runAsNonRoot") is True and "runAsNonRoot" not in sc)):
            out.append(f"{name} is not runAsNonRoot")
        if sc.get("runAsUser") == 0:
            out.append(f"{name} runs as uid 0")
        seccomp = sc.get("seccompProfile", {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name} has seccomp {seccomp}")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{name} does not drop ALL capabilities")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name} adds {sorted(caps['add'])}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{name} has a hostPort")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name} has procMount {sc['procMount']}")
    return out


def rules_of(role: dict) -> set[tuple[str, str, str]] | None:
    """The Role's rules as (API group, resource, verb), or None when a rule has more than those three keys."""
    out = set()
    for rule in role.get("rules", []):
        if set(rule) != {"apiGroups", "resources", "verbs"}:
            return None
        out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def expect_kubernetes(check, values: dict, kinds: dict[str, list[dict]], rbac_text: str) -> None:
    """backend: kubernetes: sandboxes are pods the runtime makes; nothing of Docker in its pod."""
    k8s = values.get("kubernetes") or {}
    sandbox_ns = k8s.get("namespace") or RELEASE_NAMESPACE
    deploy = kinds["Deployment"][0]
    pod = deploy["spec"]["template"]["spec"]
    runtime = container(pod, "runtime") or {}
    env = env_of(runtime)
    everything = pod.get("containers", []) + pod.get("initContainers", [])
    check(all("dind" not in c["name"] and "docker" not in c["name"] for c in everything),
          f"a Docker container beside the runtime: {[c['name'] for c in everything]}")
    check(not pod.get("initContainers"), "init containers (the executor image's copy is for the DinD engine)")
    check(all("docker" not in v["name"] and "hostPath" not in v for v in pod.get("volumes", [])),
          "a Docker volume (socket, engine storage or run folder) or a hostPath")
    check(not any(k.startswith(("DOCKER_", "XTABLES_")) for k in env), "DOCKER_HOST or XTABLES_LOCKFILE set")
    check(not any(c["metadata"]["name"].endswith("-dind") for c in kinds.get("ConfigMap", [])),
          "the DinD entrypoint's ConfigMap")
    check(runtime.get("command", [None])[-1] == "/usr/local/bin/mentis-runtime",
          "the runtime starts through the image's entrypoint, which waits for a Docker engine")
    # The settings the runtime reads.
    check(env.get("MENTIS_BACKEND") == "kubernetes", "MENTIS_BACKEND is not kubernetes")
    check(env.get("MENTIS_K8S_NAMESPACE") == sandbox_ns, f"MENTIS_K8S_NAMESPACE is not {sandbox_ns}")
    check(env.get("MENTIS_K8S_RUNTIME_NAMESPACE") == RELEASE_NAMESPACE,
          "MENTIS_K8S_RUNTIME_NAMESPACE is not the release's")
    workspace = k8s.get("workspace", "emptydir")
    check(env.get("MENTIS_K8S_WORKSPACE") == workspace, f"MENTIS_K8S_WORKSPACE is not {workspace}")
    check(env.get("MENTIS_K8S_STORAGE_CLASS") == (k8s.get("storageClass") or None), "MENTIS_K8S_STORAGE_CLASS")
    check(env.get("MENTIS_K8S_RUNTIME_CLASS") == (k8s.get("runtimeClass") or None), "MENTIS_K8S_RUNTIME_CLASS")
    check(env.get("MENTIS_K8S_IMAGE_PULL_POLICY") in ("IfNotPresent", "Never"),
          "MENTIS_K8S_IMAGE_PULL_POLICY is not IfNotPresent or Never (the executor image is a local name)")
    check(env.get("MENTIS_K8S_INTERNAL_CIDRS") == ",".join(k8s.get("internalCIDRs", [])),
          "MENTIS_K8S_INTERNAL_CIDRS is not kubernetes.internalCIDRs")
    check(bool(env.get("MENTIS_EXECUTOR_IMAGE")), "no MENTIS_EXECUTOR_IMAGE")
    pairs = [p.split("=", 1) for p in (env.get("MENTIS_K8S_RUNTIME_POD_LABELS") or "").split(",") if p]
    selector = deploy["spec"]["selector"]["matchLabels"]
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    check(dict(pairs) == selector and all(pod_labels.get(k) == v for k, v in pairs),
          "MENTIS_K8S_RUNTIME_POD_LABELS are not the runtime pod's selector labels")
    data_mount = next((m["mountPath"] for m in runtime.get("volumeMounts", []) if m["name"] == "data"), "")
    check(env.get("MENTIS_DATA_DIR", "").startswith(data_mount + "/"),
          "MENTIS_DATA_DIR is the data volume's root, which a runtime that is not root cannot make 0700")
    # The runtime's pod under Pod Security restricted, and more: read-only root, the data volume its group's.
    for violation in restricted_violations(pod):
        check(False, f"Pod Security restricted refuses it: {violation}")
    check(runtime.get("securityContext", {}).get("readOnlyRootFilesystem") is True, "the runtime's root is writable")
    uid = runtime.get("securityContext", {}).get("runAsUser", pod.get("securityContext", {}).get("runAsUser"))
    check(isinstance(uid, int) and uid > 0, "the runtime's uid is not set to a user other than root")
    check(pod.get("securityContext", {}).get("fsGroup") is not None, "no fsGroup: the data volume is root's")
    # It talks to the API as its ServiceAccount.
    accounts = {a["metadata"]["name"]: a for a in kinds.get("ServiceAccount", [])}
    account = pod.get("serviceAccountName")
    check(pod.get("automountServiceAccountToken") is True, "the pod mounts no service account token")
    check(account in accounts and accounts[account].get("automountServiceAccountToken") is True,
          f"no ServiceAccount {account} with its token mounted")
    roles, bindings = kinds.get("Role", []), kinds.get("RoleBinding", [])
    check(len(roles) == 1 and len(bindings) == 1, "not one Role and one RoleBinding")
    check("ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds, "a cluster-wide grant")
    if len(roles) != 1 or len(bindings) != 1:
        return
    role, binding = roles[0], bindings[0]
    check(role["metadata"].get("namespace") == sandbox_ns, f"the Role is not in the sandbox namespace {sandbox_ns}")
    rules = rules_of(role)
    wanted = SANDBOX_ROLE | (CLAIMS_ROLE if workspace == "pvc" else set())
    if rules is None:
        check(False, "a rule of the Role with more than API groups, resources and verbs")
    else:
        check(rules == wanted, f"the Role's rules are not exactly the backend's: more {sorted(rules - wanted)}, "
              f"fewer {sorted(wanted - rules)}")
    check(not any("*" in str(r) for r in role.get("rules", [])), "a wildcard in the Role")
    check({v for g, r, v in rules or set() if r == "secrets"} == {"create", "delete"},
          "the runtime may read Secrets (get, list or watch)")
    rule_lines = [i for i, line in enumerate(rbac_text.splitlines()) if line.strip().startswith("- apiGroups:")]
    check(all(rbac_text.splitlines()[i - 1].strip().startswith("#") for i in rule_lines) and rule_lines,
          "a rule of the Role without a comment saying why")
    check(binding["metadata"].get("namespace") == sandbox_ns,
          f"the RoleBinding is not in the sandbox namespace {sandbox_ns}")
    check(binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                 "name": role["metadata"]["name"]}, "the RoleBinding does not name the Role")
    check(binding.get("subjects") == [{"kind": "ServiceAccount", "name": account, "namespace": RELEASE_NAMESPACE}],
          "the RoleBinding's subject is not the runtime's ServiceAccount in the release namespace")
    # Its NetworkPolicy lets it reach the executors and the API server.
    check(len(kinds.get("NetworkPolicy", [])) == 1, "not one NetworkPolicy for the runtime")
    if kinds.get("NetworkPolicy"):
        egress = kinds["NetworkPolicy"][0]["spec"].get("egress", [])

        def ports(rule: dict) -> set:
            return {(p.get("port"), p.get("protocol")) for p in rule.get("ports", [])}

        check(any(ports(r) == {(50052, "TCP")} and any(
            t.get("namespaceSelector", {}).get("matchLabels") == {"kubernetes.io/metadata.name": sandbox_ns}
            for t in r.get("to", [])) for r in egress),
            f"the NetworkPolicy does not let the runtime reach executors (TCP 50052) in {sandbox_ns}")
        check(any(ports(r) >= {(443, "TCP"), (6443, "TCP")} and "to" not in r for r in egress),
              "the NetworkPolicy does not let the runtime reach the API server (TCP 443 and 6443)")


def expect(set_name: str, values: dict, kinds: dict[str, list[dict]], rbac_text: str) -> None:
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
    kubernetes = values.get("backend") == "kubernetes"
    if not kubernetes:
        # backend docker: the runtime never calls the Kubernetes API, so it has no grant and no token.
        check(not any(k in kinds for k in ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"]),
              "backend docker grants the runtime's ServiceAccount something")
        check(pod.get("automountServiceAccountToken") is False, "backend docker mounts a service account token")
        check(all(a.get("automountServiceAccountToken") is False for a in kinds["ServiceAccount"]),
              "backend docker's ServiceAccount mounts its token")
        check(not any(k.startswith(("MENTIS_BACKEND", "MENTIS_K8S_")) for k in env),
              "backend docker with Kubernetes settings")
    if kubernetes:
        expect_kubernetes(check, values, kinds, rbac_text)
    elif env.get("DOCKER_HOST") == "unix:///var/run/docker.sock":
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
    if config.get("MENTIS_DISK_LIMITS", "loop") == "loop" and not kubernetes:
        check(runtime["securityContext"].get("privileged") is True, "loop disks without a privileged runtime")
    if kubernetes:
        # Workspaces bounded by the disk limit (an emptyDir's sizeLimit, a claim's size): the Docker switch that
        # would take the limit off is never passed.
        check("MENTIS_DISK_LIMITS" not in config, "MENTIS_DISK_LIMITS passed with backend kubernetes")
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
    for name in ["default", "host-socket", "metrics", "tls", "resources", "kubernetes", "kubernetes-pvc",
                 "kubernetes-namespace"]:
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
            rendered = render(chart, values)
            docs = manifests(rendered)
        except helm.HelmError as e:
            fail(f"{set_name}: does not render: {e}")
            continue
        for path, doc in docs:
            validate(set_name, path, doc)
        kinds = by_kind(docs)
        rbac_text = next((t for p, t in rendered.items() if p.endswith("/rbac.yaml")), "")
        expect(set_name, values, kinds, rbac_text)
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
