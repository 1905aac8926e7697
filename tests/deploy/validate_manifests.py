"""Checks of the deployment files under deploy/ (no Docker or cluster needed).

Every YAML file under deploy/ must parse (all of its documents); then the
fields the deployment relies on are checked: the Kubernetes Deployment
(GPU request, probes, grace period longer than --drain_timeout, non-root,
replicas spread over nodes, a memory limit above the worst case of its
flags), the headless Service, the
PodMonitor's port, the PodDisruptionBudget, the kustomization's files, the
sidecar overlay (deploy/k8s-sidecar: klserve beside a training job, sharing
/dev/shm and a socket, under names and in a namespace of its own), the
compose services and their mounts (compose.yaml and the sidecar-style
compose.shm.yaml, whose flags are the sidecar's), the memory sums written in
the files and docs/deploy.md, the Dockerfile's stages, HEALTHCHECK and run
examples, and the Grafana panels (the error ratio against its alert, the
request panels' zero series, the step panels' windows). Where
the kubernetes-validate package is importable, the built-in Kubernetes kinds
(the base's, and the overlay's as built) are also validated against the
OpenAPI schema (strict: unknown fields fail). Where kubectl (or kustomize) is
installed, the overlay is also built by it and must match what the checks
read.

    python -m pytest -q tests/deploy/validate_manifests.py
"""

import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SIDECAR = DEPLOY / "k8s-sidecar"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
COMPOSE_SHM = DEPLOY / "compose" / "compose.shm.yaml"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"

try:
    import kubernetes_validate
except ImportError:  # the field checks alone
    kubernetes_validate = None


def yaml_files():
    return sorted(p for p in DEPLOY.rglob("*")
                  if p.suffix in (".yaml", ".yml") and p.is_file())


def load_all(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def k8s_objects():
    """(path, object) for every object of every file under deploy/k8s."""
    out = []
    for path in sorted(K8S.glob("*.y*ml")):
        for doc in load_all(path):
            out.append((path, doc))
    return out


def one(kind, name=None):
    found = [d for _, d in k8s_objects() if d.get("kind") == kind and
             (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"want one {kind} {name or ''}, got {len(found)}"
    return found[0]


def parse_duration(text):
    """Seconds in an absl duration like 30s, 1m30s, 1.5m, 500ms, 1h."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return sum(float(n) * units[u] for n, u in parts)


def parse_quantity(text):
    """Bytes in a Kubernetes quantity like 10Gi, 512Mi, 1G or 1000."""
    units = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(text))
    assert match, text
    return int(match.group(1)) * units[match.group(2) or ""]


def parse_byte_count(text):
    """Bytes in a klserve _bytes flag's value: 8589934592, 8GiB or 8 GiB
    (flags/byte_count.h; case matters there, as here)."""
    units = {"": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30,
             "TiB": 2**40}
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    assert match and match.group(2) in units, text
    return int(match.group(1)) * units[match.group(2)]


def flag(args, name):
    """The value of --name=VALUE in args, or None."""
    values = [a.split("=", 1)[1] for a in args
              if a.startswith(f"--{name}=")]
    assert len(values) <= 1, f"--{name} given twice"
    return values[0] if values else None


# ---------------------------------------------------------------- all YAML

def test_there_are_yaml_files():
    names = {p.relative_to(DEPLOY).as_posix() for p in yaml_files()}
    for want in ("compose/compose.yaml", "compose/compose.shm.yaml",
                 "k8s/kustomization.yaml", "k8s/deployment.yaml",
                 "k8s/service.yaml", "k8s/podmonitor.yaml",
                 "k8s-sidecar/kustomization.yaml", "k8s-sidecar/trainer.yaml",
                 "prometheus/prometheus.yml"):
        assert want in names


@pytest.mark.parametrize("path", yaml_files(),
                         ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_yaml_parses(path):
    docs = load_all(path)
    assert docs, f"{path} holds no document"
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: a document is not a mapping"


def test_grafana_dashboard_is_json():
    for path in (DEPLOY / "grafana" / "dashboards").glob("*.json"):
        json.loads(path.read_text(encoding="utf-8"))


def test_dashboard_error_ratio_is_the_alerts_expression():
    """The panel shows what KlserveHighErrorRatio compares with its
    threshold, so that the two never disagree about what a failure is."""
    rules = load_all(DEPLOY / "prometheus" / "alerts.yml")[0]
    (alert,) = [r for g in rules["groups"] for r in g["rules"]
                if r.get("alert") == "KlserveHighErrorRatio"]
    expr, threshold = alert["expr"].strip().rsplit(">", 1)
    float(threshold)
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" /
                            "klserve.json").read_text(encoding="utf-8"))
    (panel,) = [p for p in dashboard["panels"] if p["title"] == "Error ratio"]
    (target,) = panel["targets"]

    def squeeze(text):
        text = " ".join(text.split())
        return text.replace("( ", "(").replace(" )", ")")

    assert squeeze(target["expr"]) == squeeze(expr)


def dashboard_panels():
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" /
                            "klserve.json").read_text(encoding="utf-8"))
    return {p["title"]: p for p in dashboard["panels"]}


@pytest.mark.parametrize("title", ["Requests per second", "Failed requests"])
def test_dashboard_request_panels_leave_out_zero_series(title):
    """klserve creates a klserve_requests_total series for every method and
    code at start (136 a replica): plotted as they are, the legend lists
    every one, nearly all flat at 0."""
    for target in dashboard_panels()[title]["targets"]:
        assert re.search(r"\)\s*>\s*0\s*$", target["expr"]), target["expr"]


@pytest.mark.parametrize("title", ["Mean loss per step over the window",
                                   "Steps per second",
                                   "Step loss distribution"])
def test_dashboard_step_panels_use_windows_of_five_minutes(title):
    """Over $__rate_interval alone (1 minute with a 15 s scrape), a run
    slower than a step a minute has no step in most windows: 0/0 gaps in the
    mean loss, and zeros between spikes. Each window is a fixed 5 minutes or
    more, or the panel's min interval makes it so."""
    panel = dashboard_panels()[title]
    for target in panel["targets"]:
        windows = re.findall(r"\[([^\]]+)\]", target["expr"])
        assert windows, target["expr"]
        for window in windows:
            if window in ("$__rate_interval", "$__interval"):
                window = panel.get("interval", "")
            assert window and parse_duration(window) >= 300, (
                title, target["expr"], panel.get("interval"))


# ---------------------------------------------------------------- kubernetes

def container():
    deployment = one("Deployment", "klserve")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def args_with_flagfile(objects, pod, c):
    """A container's command and args plus the flags of the ConfigMap its
    --flagfile names, in the order klserve reads them (flags after the
    flagfile override it)."""
    args = list(c.get("command", [])) + list(c.get("args", []))
    flagfile = flag(args, "flagfile")
    if not flagfile:
        return args
    mount = next(m for m in c["volumeMounts"]
                 if flagfile.startswith(m["mountPath"].rstrip("/") + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    name = volume["configMap"]["name"]
    maps = [d for d in objects if d.get("kind") == "ConfigMap" and
            d["metadata"]["name"] == name]
    assert len(maps) == 1, f"flagfile {flagfile}: no ConfigMap {name}"
    key = flagfile[len(mount["mountPath"].rstrip("/")) + 1:]
    assert key in maps[0]["data"], f"flagfile {flagfile}: no key {key}"
    at = args.index(f"--flagfile={flagfile}")
    from_file = [l.strip() for l in maps[0]["data"][key].splitlines()
                 if l.strip() and not l.strip().startswith("#")]
    return args[:at] + from_file + args[at + 1:]


def last_flag(args, name):
    """The value klserve takes for --name: the last given; "true" for a bare
    boolean --name; None when absent."""
    value = None
    for a in args:
        if a == f"--{name}":
            value = "true"
        elif a.startswith(f"--{name}="):
            value = a.split("=", 1)[1]
    return value


def all_args():
    """The container's args plus the flags of the ConfigMap's flagfile."""
    pod = one("Deployment", "klserve")["spec"]["template"]["spec"]
    return args_with_flagfile([d for _, d in k8s_objects()], pod, container())


def test_deployment_requests_a_gpu_and_sizes_cpu_memory():
    resources = container()["resources"]
    for section in ("requests", "limits"):
        assert str(resources[section]["nvidia.com/gpu"]) == "1", section
        assert "cpu" in resources[section] and "memory" in resources[section]


def test_deployment_ports_are_named():
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9464}
    args = all_args()
    listen = flag(args, "listen")
    assert listen is None or listen.endswith(":50051")
    metrics = flag(args, "metrics_listen")
    assert metrics is None or metrics.endswith(":9464")


def test_deployment_probes_use_grpc_health():
    c = container()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probe in c, probe
        assert c[probe]["grpc"]["port"] == 50051, probe


def startup_allowance_s():
    """The seconds the Deployment's startup probe gives klserve to start."""
    probe = container()["startupProbe"]
    return (probe.get("initialDelaySeconds", 0) +
            probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))


def test_deployment_spreads_its_replicas_over_nodes():
    """One node's loss or drain should not take every replica; preferred,
    not required, so that a cluster of one GPU node still runs them all."""
    pod = one("Deployment", "klserve")["spec"]["template"]
    labels = pod["metadata"]["labels"]
    spec = pod["spec"]
    anti = spec.get("affinity", {}).get("podAntiAffinity", {})
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
    spread = [c for c in spec.get("topologySpreadConstraints", [])
              if c["topologyKey"] == "kubernetes.io/hostname" and
              c["whenUnsatisfiable"] == "ScheduleAnyway" and
              c["labelSelector"]["matchLabels"].items() <= labels.items()]
    preferred = [
        t["podAffinityTerm"] for t in
        anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])
        if t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        and t["podAffinityTerm"]["labelSelector"]["matchLabels"].items()
        <= labels.items()]
    assert spread or preferred, spec.get("affinity")


def test_grace_period_outlasts_drain_and_prestop():
    pod = one("Deployment", "klserve")["spec"]["template"]["spec"]
    grace = pod["terminationGracePeriodSeconds"]
    drain = flag(all_args(), "drain_timeout")
    drain_s = parse_duration(drain) if drain else 30.0  # klserve's default
    prestop = container().get("lifecycle", {}).get("preStop", {})
    sleep_s = prestop.get("sleep", {}).get("seconds", 0)
    assert grace > drain_s + sleep_s, (grace, drain_s, sleep_s)


def test_deployment_runs_as_non_root():
    pod = one("Deployment", "klserve")["spec"]["template"]["spec"]
    pod_sc = pod.get("securityContext", {})
    sc = {**pod_sc, **container().get("securityContext", {})}
    assert sc.get("runAsNonRoot") is True
    assert sc.get("runAsUser", 1) != 0
    assert sc.get("allowPrivilegeEscalation") is False
    assert sc.get("readOnlyRootFilesystem") is True
    # The TensorBoard directory is writable: an emptyDir (or a claim).
    tb = flag(all_args(), "tensorboard_dir")
    if tb:
        mounts = {m["mountPath"]: m["name"] for m in container()["volumeMounts"]}
        assert tb in mounts, f"--tensorboard_dir={tb} is not a volume"
        volume = next(v for v in pod["volumes"] if v["name"] == mounts[tb])
        assert "emptyDir" in volume or "persistentVolumeClaim" in volume


def assert_tensorboard_bytes_fit_the_volume(pod, c, args):
    """The kubelet evicts a pod whose emptyDir passes its sizeLimit, so the
    event files' bound (one step's records and a few blocks past it) must
    leave room below the limit."""
    tb = last_flag(args, "tensorboard_dir")
    if not tb:
        return
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volume = next(v for v in pod["volumes"] if v["name"] == mounts[tb])
    limit = volume.get("emptyDir", {}).get("sizeLimit")
    if limit is None:
        return
    bound = last_flag(args, "max_tensorboard_bytes")
    bound = parse_byte_count(bound) if bound else 16 * 2**30  # the default
    assert bound <= 0.9 * parse_quantity(limit), (bound, limit)


def test_tensorboard_bytes_fit_the_volume():
    pod = one("Deployment", "klserve")["spec"]["template"]["spec"]
    assert_tensorboard_bytes_fit_the_volume(pod, container(), all_args())


# klserve's defaults (klserve --help) of the flags that bound its memory.
MEMORY_FLAG_DEFAULTS = {
    "max_message_bytes": "256MiB", "max_open_streams": "16",
    "max_stream_key_bytes": "1GiB", "max_concurrent_requests": "8",
    "max_thread_scratch_bytes": "1GiB", "transport_memory_bytes": "4GiB",
    "threads": "0"}


def worst_case_memory(c, args):
    """What klserve may hold at most with these flags (docs/security.md,
    "Resource model"): every open stream 4 messages (3 held and a tile's
    rows) and its key side, every unary call computing its request and
    response and as many answers again waiting for their clients (up to
    twice --max_concurrent_requests messages) and its d_index_key sum, every compute thread its scratch, and gRPC's
    buffers."""
    value = lambda name: (last_flag(args, name) or
                          MEMORY_FLAG_DEFAULTS[name])
    message = parse_byte_count(value("max_message_bytes"))
    streams = int(value("max_open_streams"))
    threads = int(value("threads")) or int(c["resources"]["limits"]["cpu"])
    key_side = parse_byte_count(value("max_stream_key_bytes"))
    calls = int(value("max_concurrent_requests"))
    return (streams * 4 * message + streams * key_side +
            calls * 4 * message + calls * key_side +
            threads * parse_byte_count(value("max_thread_scratch_bytes")) +
            parse_byte_count(value("transport_memory_bytes")))


def assert_memory_fits_the_limit(c, args):
    """The worst case of the flags, plus 1 GiB for the process itself, stays
    under the container's memory limit: past it the kernel kills klserve
    with every call in flight."""
    limit = parse_quantity(c["resources"]["limits"]["memory"])
    bound = worst_case_memory(c, args)
    assert bound + 2**30 <= limit, (bound / 2**30, limit / 2**30)


def test_deployment_memory_fits_the_limit():
    assert_memory_fits_the_limit(container(), all_args())


def test_service_is_headless_and_selects_the_pods():
    service = one("Service")
    labels = one("Deployment", "klserve")["spec"]["template"]["metadata"][
        "labels"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["grpc"]["port"] == 50051


def test_podmonitor_scrapes_the_metrics_port():
    monitor = one("PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    labels = one("Deployment", "klserve")["spec"]["template"]["metadata"][
        "labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    port_names = {p["name"] for p in container()["ports"]}
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] == "metrics" and "metrics" in port_names
        assert_job_is_the_alerts_job(endpoint)


def assert_job_is_the_alerts_job(endpoint):
    """The Prometheus Operator names a PodMonitor's job
    "<namespace>/<name>"; the alerts select job="klserve", so the endpoint
    must set it."""
    alerts = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    assert 'up{job="klserve"}' in alerts
    relabelings = endpoint.get("relabelings", [])
    assert any(r.get("targetLabel") == "job" and
               r.get("replacement") == "klserve" and
               r.get("action", "replace") == "replace" and
               not r.get("sourceLabels") for r in relabelings), relabelings


def test_networkpolicy_admits_clients_to_grpc_and_prometheus_to_metrics():
    policy = one("NetworkPolicy")
    labels = one("Deployment", "klserve")["spec"]["template"]["metadata"][
        "labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= \
        labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    port_names = {p["name"] for p in container()["ports"]}
    admitted = {}
    for rule in policy["spec"]["ingress"]:
        (peer,) = rule["from"]
        for port in rule["ports"]:
            assert port["port"] in port_names, port
            admitted[port["port"]] = peer["podSelector"]["matchLabels"]
    assert admitted == {
        "grpc": {"klserve-client": "true"},
        "metrics": {"app.kubernetes.io/name": "prometheus"}}


def test_poddisruptionbudget_selects_the_deployments_pods():
    pdb = one("PodDisruptionBudget", "klserve")
    deployment = one("Deployment", "klserve")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = pdb["spec"]["selector"]
    assert set(selector) == {"matchLabels"}, selector  # what is checked
    assert selector["matchLabels"]
    assert selector["matchLabels"].items() <= labels.items()
    # One of the two, and a budget that lets a drain evict a pod whatever
    # the number of replicas.
    spec = pdb["spec"]
    assert ("maxUnavailable" in spec) != ("minAvailable" in spec), spec
    if "maxUnavailable" in spec:
        assert isinstance(spec["maxUnavailable"], int), spec
        assert spec["maxUnavailable"] >= 1
    else:
        assert isinstance(spec["minAvailable"], int), spec
        assert spec["minAvailable"] < deployment["spec"]["replicas"]


def test_kustomization_lists_existing_files():
    kustomization = load_all(K8S / "kustomization.yaml")[0]
    assert kustomization["kind"] == "Kustomization"
    listed = set(kustomization["resources"])
    for resource in listed:
        assert (K8S / resource).is_file(), f"{resource} is missing"
    on_disk = {p.name for p in K8S.glob("*.y*ml")} - {"kustomization.yaml"}
    assert on_disk == listed, f"not in resources: {on_disk - listed}"
    images = {i["name"] for i in kustomization.get("images", [])}
    assert container()["image"].split(":")[0] in images


@pytest.mark.skipif(kubernetes_validate is None,
                    reason="kubernetes-validate not installed")
def test_builtin_kinds_match_the_kubernetes_schema():
    version = kubernetes_validate.latest_version()
    checked = 0
    objects = [(path.name, doc) for path, doc in k8s_objects()]
    objects += [("k8s-sidecar (built)", doc) for doc in build_sidecar()]
    for where, doc in objects:
        if doc["apiVersion"] in ("monitoring.coreos.com/v1",
                                 "kustomize.config.k8s.io/v1beta1"):
            continue  # CRDs / kustomize config: no schema bundled
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{where} {doc['kind']}: {e.message} "
                        f"at {list(e.path)}")
        checked += 1
    assert checked >= 6


# ---------------------------------------------------------------- sidecar
#
# deploy/k8s-sidecar is an overlay of deploy/k8s. The checks below read it as
# kustomize builds it: build_sidecar() does the few things the overlay uses
# (a base directory and files as resources, deleting patches, JSON patch
# replaces, a name prefix or suffix with the ConfigMap volumes that refer to
# the renamed objects, namespace, images) and refuses anything else, so that
# the overlay cannot grow a feature these checks would not see.
# test_sidecar_build_matches_kustomize compares it with the real thing where
# kubectl or kustomize is installed.

SOCKET = "/run/klserve/klserve.sock"


def kustomization(directory):
    doc = load_all(directory / "kustomization.yaml")[0]
    assert doc["kind"] == "Kustomization"
    known = {"apiVersion", "kind", "namespace", "namePrefix", "nameSuffix",
             "labels", "resources", "patches", "images"}
    assert set(doc) <= known, f"{directory}: not checked: {set(doc) - known}"
    return doc


def set_image(objects, images):
    by_name = {i["name"]: i for i in images}
    for doc in objects:
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            image = by_name.get(c["image"].split(":")[0])
            if image:
                c["image"] = f"{image['newName']}:{image['newTag']}"


def delete_target(patch):
    """The (kind, name) a `$patch: delete` patch removes, or None."""
    doc = yaml.safe_load(patch["patch"])
    if isinstance(doc, dict) and doc.get("$patch") == "delete":
        assert "target" not in patch
        return doc["kind"], doc["metadata"]["name"]
    return None


def json_patch(objects, patch):
    """A target's JSON patch, `replace` operations only."""
    target = patch["target"]
    hits = [d for d in objects if d["kind"] == target["kind"] and
            d["metadata"]["name"] == target["name"]]
    assert len(hits) == 1, f"patch target {target}: {len(hits)} objects"
    for op in yaml.safe_load(patch["patch"]):
        assert op["op"] == "replace", f"not checked: {op['op']}"
        *parents, last = op["path"].strip("/").split("/")
        node = hits[0]
        for part in parents:
            node = node[part]
        assert last in node, f"replace of missing {op['path']}"
        node[last] = op["value"]


def rename(objects, prefix, suffix):
    """kustomize's namePrefix and nameSuffix: every object renamed, and the
    references to the renamed ConfigMaps (pod volumes, the only kind the
    manifests use; others are refused) renamed with them."""
    renamed = {}
    for d in objects:
        old = d["metadata"]["name"]
        d["metadata"]["name"] = prefix + old + suffix
        renamed[(d["kind"], old)] = d["metadata"]["name"]
    for d in objects:
        pod = d.get("spec", {}).get("template", {}).get("spec", {})
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            assert "envFrom" not in c, f"{c['name']}: envFrom not checked"
            for e in c.get("env", []):
                assert "valueFrom" not in e, f"{e['name']}: not checked"
        for v in pod.get("volumes", []):
            assert "projected" not in v, f"volume {v['name']}: not checked"
            if "configMap" in v:
                name = v["configMap"]["name"]
                v["configMap"]["name"] = renamed.get(("ConfigMap", name),
                                                     name)


def build_kustomization(directory):
    kz = kustomization(directory)
    objects = []
    for resource in kz["resources"]:
        path = (directory / resource).resolve()
        if path.is_dir():
            objects += build_kustomization(path)
        else:
            assert path.parent == directory.resolve(), resource
            objects += load_all(path)
    deleted = set()
    for patch in kz.get("patches", []):
        target = delete_target(patch)
        if target:
            deleted.add(target)
        else:
            json_patch(objects, patch)
    gone = {(d["kind"], d["metadata"]["name"]) for d in objects} & deleted
    assert gone == deleted, f"nothing to delete for {deleted - gone}"
    objects = [d for d in objects
               if (d["kind"], d["metadata"]["name"]) not in deleted]
    if "namePrefix" in kz or "nameSuffix" in kz:
        rename(objects, kz.get("namePrefix", ""), kz.get("nameSuffix", ""))
    if "namespace" in kz:
        for d in objects:
            if d["kind"] == "Namespace":
                d["metadata"]["name"] = kz["namespace"]
            else:
                d["metadata"]["namespace"] = kz["namespace"]
    set_image(objects, kz.get("images", []))
    return objects


def build_sidecar():
    return build_kustomization(SIDECAR)


def sidecar_name(name):
    """What the overlay calls an object named `name` in its files."""
    kz = kustomization(SIDECAR)
    return kz.get("namePrefix", "") + name + kz.get("nameSuffix", "")


def sidecar_one(kind, name=None):
    """The built overlay's one `kind`, named `name` in the files."""
    found = [d for d in build_sidecar() if d["kind"] == kind and
             (name is None or d["metadata"]["name"] == sidecar_name(name))]
    assert len(found) == 1, f"want one {kind} {name or ''}, got {len(found)}"
    return found[0]


def sidecar_pod():
    return sidecar_one("Job", "trainer")["spec"]["template"]["spec"]


def sidecar_klserve():
    init = [c for c in sidecar_pod().get("initContainers", [])
            if c["name"] == "klserve"]
    assert len(init) == 1, "klserve is not an init container of the pod"
    return init[0]


def sidecar_trainer():
    containers = sidecar_pod()["containers"]
    assert [c["name"] for c in containers] == ["trainer"]
    return containers[0]


def sidecar_args():
    return args_with_flagfile(build_sidecar(), sidecar_pod(),
                              sidecar_klserve())


def mounted_volume(c, path):
    """The pod volume a container mounts at path (asserts there is one)."""
    names = [m["name"] for m in c.get("volumeMounts", [])
             if m["mountPath"] == path]
    assert len(names) == 1, f"{c['name']}: nothing mounted at {path}"
    volumes = [v for v in sidecar_pod()["volumes"] if v["name"] == names[0]]
    assert len(volumes) == 1, f"no volume {names[0]}"
    return volumes[0]


def test_sidecar_overlay_builds_on_the_base():
    kz = kustomization(SIDECAR)
    assert (SIDECAR / kz["resources"][0]).resolve() == K8S
    on_disk = {p.name for p in SIDECAR.glob("*.y*ml")} - {"kustomization.yaml"}
    assert on_disk == set(kz["resources"][1:]), "files not in resources"
    kinds = {(d["kind"], d["metadata"]["name"]) for d in build_sidecar()}
    # The shared replicas, their Service and their PodDisruptionBudget are
    # gone, and so is the Namespace: the job's exists already, and an overlay
    # owning it would delete it with `kubectl delete -k`. The flags and the
    # PodMonitor stay, in the job's namespace.
    assert ("Deployment", "klserve") not in kinds
    assert ("Service", "klserve-headless") not in kinds
    assert ("PodDisruptionBudget", "klserve") not in kinds
    assert not [k for k in kinds if k[0] == "Namespace"], kinds
    for kind, name in (("Job", "trainer"), ("ConfigMap", "klserve-flags"),
                       ("PodMonitor", "klserve")):
        assert (kind, sidecar_name(name)) in kinds, (kind, name)
    namespaces = {d["metadata"].get("namespace") for d in build_sidecar()}
    assert namespaces == {kz["namespace"]}
    images = {c["image"] for c in [sidecar_klserve(), sidecar_trainer()]}
    assert all(":" in i for i in images), images  # both named in images:


def test_sidecar_objects_are_its_own():
    """Applied where deploy/k8s runs, an object of the base's kind and name
    would replace the base's (its PodMonitor then scraping the trainer pods,
    not klserve's), and `kubectl delete -k deploy/k8s-sidecar` would delete
    it. And the namespace is the job's, not the base's."""
    base = build_kustomization(K8S)
    (base_namespace,) = {d["metadata"].get("namespace") for d in base
                         if d["kind"] != "Namespace"}
    assert kustomization(SIDECAR)["namespace"] != base_namespace
    base_names = {(d["kind"], d["metadata"]["name"]) for d in base}
    for d in build_sidecar():
        key = (d["kind"], d["metadata"]["name"])
        assert key not in base_names, f"{key} is the base's too"
    # The flags volume follows its ConfigMap's new name.
    (volume,) = [v for v in sidecar_pod()["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == sidecar_name("klserve-flags")


def test_sidecar_is_a_sidecar_container_of_the_job():
    # restartPolicy: Always makes the init container a sidecar: started (and
    # its startup probe passed) before the job, stopped after it, so the Job
    # completes.
    assert sidecar_klserve()["restartPolicy"] == "Always"
    assert sidecar_pod()["restartPolicy"] == "Never"
    env = {e["name"]: e.get("value") for e in sidecar_trainer()["env"]}
    assert env["KLSERVE_TARGET"] == f"unix:{SOCKET}"
    assert_default_client_uses_shared_memory(env)


def assert_default_client_uses_shared_memory(env):
    """klserve.default_client(), which klserve.jax and klserve.torch use,
    maps regions only when KLSERVE_SHARED_MEMORY is 1 (or true, yes, on):
    without it the job's tensors travel in the messages, the sidecar's
    /dev/shm unused."""
    client = (ROOT / "client" / "python" / "src" / "klserve" /
              "_client.py").read_text(encoding="utf-8")
    assert '"KLSERVE_SHARED_MEMORY"' in client
    assert str(env.get("KLSERVE_SHARED_MEMORY", "")).strip().lower() in (
        "1", "true", "yes", "on"), env


def test_sidecar_flags():
    c = sidecar_klserve()
    # Not the image's ENTRYPOINT, which adds --listen=0.0.0.0:50051.
    assert c["command"] == ["/usr/local/bin/klserve"]
    args = sidecar_args()
    listen = last_flag(args, "listen").split(",")
    assert sorted(listen) == sorted(["127.0.0.1:50051", f"unix:{SOCKET}"])
    assert last_flag(args, "shared_memory") == "true"
    # The socket admits the pod's group (a job of another user in fsGroup).
    assert last_flag(args, "unix_socket_mode") == "0660"
    assert last_flag(args, "metrics_listen").endswith(":9464")
    # The base deployment's flags (its flagfile among them), it gives too.
    for arg in container()["args"]:
        assert arg in c["args"], arg
    threads = int(last_flag(args, "threads"))
    assert threads == int(c["resources"]["limits"]["cpu"])


def test_sidecar_memory_fits_the_limit():
    assert_memory_fits_the_limit(sidecar_klserve(), sidecar_args())


def gib_after(pattern, path):
    """The GiB figures that follow `pattern` (whitespace and comment marks
    between words ignored) in a file."""
    text = " ".join(path.read_text(encoding="utf-8").replace("#", " ")
                    .split())
    return [float(g) for g in re.findall(pattern + r" ([\d.]+) GiB", text)]


def test_documented_worst_cases_are_the_flags():
    """The sums written beside the caps (trainer.yaml's comments,
    compose.shm.yaml's, docs/deploy.md) are what the flags add up to."""
    sidecar = worst_case_memory(sidecar_klserve(), sidecar_args()) / 2**30
    deployment = worst_case_memory(container(), all_args()) / 2**30
    docs = ROOT / "docs" / "deploy.md"
    found = {
        "trainer.yaml, in all": gib_after(r"in all", SIDECAR / "trainer.yaml"),
        "trainer.yaml, at most": gib_after(r"at most",
                                           SIDECAR / "trainer.yaml"),
        "compose.shm.yaml": gib_after(r"may hold to", COMPOSE_SHM),
        "deploy.md, sidecar": gib_after(r"buffers \(\d+ GiB\):", docs),
    }
    for where, values in found.items():
        assert values == [sidecar], (where, values, sidecar)
    assert gib_after(r"buffers \(\d+ GiB\),", docs) == [deployment]


def test_sidecar_tensorboard_bytes_fit_the_volume():
    assert_tensorboard_bytes_fit_the_volume(sidecar_pod(), sidecar_klserve(),
                                            sidecar_args())


def test_sidecar_shares_dev_shm_and_the_socket():
    klserve, trainer = sidecar_klserve(), sidecar_trainer()
    shm = mounted_volume(klserve, "/dev/shm")
    assert mounted_volume(trainer, "/dev/shm") == shm
    assert shm["emptyDir"]["medium"] == "Memory"
    assert "sizeLimit" in shm["emptyDir"]  # must hold the job's regions
    socket_dir = str(pathlib.PurePosixPath(SOCKET).parent)
    sock = mounted_volume(klserve, socket_dir)
    assert mounted_volume(trainer, socket_dir) == sock
    assert "emptyDir" in sock
    for c in (klserve, trainer):
        for path in ("/dev/shm", socket_dir):
            m = next(m for m in c["volumeMounts"] if m["mountPath"] == path)
            assert not m.get("readOnly"), f"{c['name']}: {path} read-only"


def test_sidecar_probes_run_klctl_on_the_socket():
    c = sidecar_klserve()
    copies = [rest for w, rest in stages()[-1]["lines"] if w == "COPY"]
    klctl = next(c.split()[-1] for c in copies if "/klctl" in c)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = c[probe]["exec"]["command"]
        assert command[0] == klctl.rstrip("/") + "/klctl", probe
        assert command[1] == "health", probe
        assert flag(command, "target") == f"unix:{SOCKET}", probe
        assert flag(command, "max_attempts") == "1", probe
        deadline = parse_duration(flag(command, "deadline"))
        assert deadline < c[probe]["timeoutSeconds"], probe


def test_sidecar_runs_as_non_root_like_the_base():
    pod = sidecar_pod()
    base_pod = one("Deployment", "klserve")["spec"]["template"]["spec"]
    assert pod["securityContext"] == base_pod["securityContext"]
    assert (sidecar_klserve()["securityContext"]
            == container()["securityContext"])
    assert sidecar_trainer()["securityContext"][
        "allowPrivilegeEscalation"] is False
    for flagged in ("tensorboard_dir",):
        path = last_flag(sidecar_args(), flagged)
        if path:
            volume = mounted_volume(sidecar_klserve(), path)
            assert "emptyDir" in volume or "persistentVolumeClaim" in volume
    assert "emptyDir" in mounted_volume(sidecar_klserve(), "/tmp")


def test_sidecar_resources_and_grace_period():
    for c in (sidecar_klserve(), sidecar_trainer()):
        assert "cpu" in c["resources"]["requests"], c["name"]
        assert "memory" in c["resources"]["limits"], c["name"]
    drain = parse_duration(last_flag(sidecar_args(), "drain_timeout"))
    assert sidecar_pod()["terminationGracePeriodSeconds"] > drain


def test_sidecar_podmonitor_scrapes_the_sidecar():
    monitor = sidecar_one("PodMonitor")
    labels = sidecar_one("Job", "trainer")["spec"]["template"]["metadata"][
        "labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for p in sidecar_klserve()["ports"]}
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] in ports
        assert_job_is_the_alerts_job(endpoint)


def kustomize_command():
    if shutil.which("kustomize"):
        return ["kustomize", "build", str(SIDECAR)]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize", str(SIDECAR)]
    return None


@pytest.mark.skipif(kustomize_command() is None,
                    reason="neither kustomize nor kubectl installed")
def test_sidecar_build_matches_kustomize():
    done = subprocess.run(kustomize_command(), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    built = [d for d in yaml.safe_load_all(done.stdout) if d is not None]
    ours = build_sidecar()
    key = lambda d: (d["kind"], d["metadata"]["name"])
    assert sorted(map(key, built)) == sorted(map(key, ours))
    for theirs in built:
        mine = next(d for d in ours if key(d) == key(theirs))
        # kustomize adds the base's labels; everything else must agree.
        for d in (theirs, mine):
            d["metadata"].pop("labels", None)
        assert theirs == mine, key(theirs)


# ---------------------------------------------------------------- compose

def compose():
    return load_all(COMPOSE)[0]


def test_compose_services():
    services = compose()["services"]
    for name in ("klserve", "prometheus", "grafana"):
        assert name in services, name
    klserve = services["klserve"]
    assert "profiles" not in klserve  # on by default, CPU
    assert "--backend=cpu" in klserve["command"]
    assert klserve["build"]["dockerfile"] == "deploy/docker/Dockerfile"
    assert (COMPOSE.parent / klserve["build"]["context"]).resolve() == ROOT
    ports = {p.split(":")[-1] for p in klserve["ports"]}
    assert {"50051", "9464"} <= ports
    drain = flag(klserve["command"], "drain_timeout") or "30s"
    grace = parse_duration(klserve["stop_grace_period"])
    assert grace > parse_duration(drain)
    gpu = services.get("klserve-gpu")
    if gpu is not None:  # optional, behind a profile
        assert gpu.get("profiles") == ["gpu"]
        devices = gpu["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]


@pytest.mark.parametrize("path", [COMPOSE, COMPOSE_SHM],
                         ids=lambda p: p.name)
def test_compose_mounts_exist(path):
    doc = load_all(path)[0]
    named = set(doc.get("volumes", {}) or {})
    for name, service in doc["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                host = (path.parent / source).resolve()
                assert host.exists(), f"{name}: {source} does not exist"
                assert ROOT in host.parents, f"{name}: {source} outside repo"
            else:
                assert source in named, f"{name}: volume {source} undeclared"


def mounts(service):
    """{path in the container: volume} of a compose service."""
    return {v.split(":")[1]: v.split(":")[0]
            for v in service.get("volumes", [])}


def test_compose_shm_runs_klserve_beside_the_trainer():
    doc = load_all(COMPOSE_SHM)[0]
    services = doc["services"]
    assert set(services) == {"klserve", "trainer"}
    klserve, trainer = services["klserve"], services["trainer"]
    # The same image as compose.yaml's klserve.
    assert klserve["build"] == compose()["services"]["klserve"]["build"]
    # Not the image's ENTRYPOINT, which adds --listen=0.0.0.0:50051.
    assert klserve["entrypoint"] == ["/usr/local/bin/klserve"]
    args = klserve["command"]
    listen = last_flag(args, "listen").split(",")
    assert sorted(listen) == sorted(["127.0.0.1:50051", f"unix:{SOCKET}"])
    assert last_flag(args, "shared_memory") == "true"
    grace = parse_duration(klserve["stop_grace_period"])
    assert grace > parse_duration(last_flag(args, "drain_timeout") or "30s")
    # One /dev/shm and one loopback, as in a pod: the trainer joins
    # klserve's IPC and network namespaces.
    assert klserve["ipc"] == "shareable" and "shm_size" in klserve
    assert trainer["ipc"] == "service:klserve"
    assert trainer["network_mode"] == "service:klserve"
    assert "ports" not in trainer  # it has klserve's network
    # The socket's directory: one volume, mounted in both.
    socket_dir = str(pathlib.PurePosixPath(SOCKET).parent)
    volume = mounts(klserve)[socket_dir]
    assert mounts(trainer)[socket_dir] == volume
    opts = doc["volumes"][volume]["driver_opts"]
    assert opts["type"] == "tmpfs" and "uid=10001" in opts["o"].split(",")
    assert trainer["environment"]["KLSERVE_TARGET"] == f"unix:{SOCKET}"
    assert_default_client_uses_shared_memory(trainer["environment"])
    assert trainer["user"].split(":")[0] == "10001"  # opens its objects
    # Healthy means serving on the socket, before the trainer starts.
    test = klserve["healthcheck"]["test"]
    assert test[:3] == ["CMD", "/usr/local/bin/klctl", "health"]
    assert flag(test, "target") == f"unix:{SOCKET}"
    assert trainer["depends_on"]["klserve"]["condition"] == "service_healthy"
    tb = last_flag(args, "tensorboard_dir")
    assert tb is None or tb in mounts(klserve)
    if klserve.get("read_only"):
        assert "/tmp" in klserve.get("tmpfs", [])


def test_compose_shm_gives_the_sidecars_flags():
    """One list of flags, written twice: the compose klserve runs with the
    Kubernetes sidecar's args (its caps among them) less the --flagfile,
    and takes from the flagfile only --tensorboard_dir."""
    command = list(load_all(COMPOSE_SHM)[0]["services"]["klserve"]["command"])
    sidecar = [a for a in sidecar_klserve()["args"]
               if not a.startswith("--flagfile=")]
    tensorboard = [a for a in command if a.startswith("--tensorboard_dir=")]
    assert tensorboard == [
        f"--tensorboard_dir={last_flag(sidecar_args(), 'tensorboard_dir')}"]
    assert [a for a in command if a not in tensorboard] == sidecar


def parse_compose_bytes(text):
    """Bytes in a compose byte value like 8g, 512m or 1024 (units of 1024)."""
    units = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "m": 2**20,
             "mb": 2**20, "g": 2**30, "gb": 2**30}
    match = re.fullmatch(r"(\d+)([a-z]*)", str(text).lower())
    assert match and match.group(2) in units, text
    return int(match.group(1)) * units[match.group(2)]


def test_compose_shm_memory_fits_the_limit():
    """The Kubernetes sidecar's check, for its compose twin: the memory
    limit holds the caps' worst case plus 1 GiB (and the cpus bound what
    --threads left at 0 would take)."""
    klserve = load_all(COMPOSE_SHM)[0]["services"]["klserve"]
    limits = {"cpu": str(klserve["cpus"]),
              "memory": str(parse_compose_bytes(klserve["mem_limit"]))}
    assert_memory_fits_the_limit({"resources": {"limits": limits}},
                                 klserve["command"])


def test_compose_prometheus_scrapes_klserve_service():
    prometheus = compose()["services"]["prometheus"]
    config_arg = next(a for a in prometheus["command"]
                      if a.startswith("--config.file="))
    in_container = config_arg.split("=", 1)[1]
    host = next(v.split(":")[0] for v in prometheus["volumes"]
                if v.split(":")[1] == in_container)
    config = load_all((COMPOSE.parent / host).resolve())[0]
    # Rule files resolve beside the config file in the container.
    mounted = {pathlib.PurePosixPath(v.split(":")[1]).name
               for v in prometheus["volumes"]}
    for rule_file in config.get("rule_files", []):
        assert rule_file in mounted, rule_file
    job = next(j for j in config["scrape_configs"]
               if j["job_name"] == "klserve")
    targets = []
    for sd in job.get("static_configs", []):
        targets += sd["targets"]
    for sd in job.get("dns_sd_configs", []):
        targets += [f"{n}:{sd['port']}" for n in sd["names"]]
    assert "klserve:9464" in targets


def test_compose_grafana_provisioning():
    grafana = compose()["services"]["grafana"]
    targets = {v.split(":")[1]: (COMPOSE.parent / v.split(":")[0]).resolve()
               for v in grafana["volumes"] if v.startswith(".")}
    provider = load_all(DEPLOY / "grafana" / "provisioning" / "dashboards" /
                        "klserve.yml")[0]
    dashboards_path = provider["providers"][0]["options"]["path"]
    assert targets[dashboards_path] == (DEPLOY / "grafana" / "dashboards")
    assert any(p.startswith("/etc/grafana/provisioning") for p in targets)


# ---------------------------------------------------------------- Dockerfile

def dockerfile_instructions():
    """(INSTRUCTION, arguments) with continuation lines joined."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages():
    result, current = [], None
    for word, rest in dockerfile_instructions():
        if word == "FROM":
            current = {"from": rest, "lines": []}
            result.append(current)
        elif current is not None:
            current["lines"].append((word, rest))
    return result


def dockerfile_args():
    """The ARG defaults declared before the first FROM."""
    args = {}
    for word, rest in dockerfile_instructions():
        if word == "FROM":
            break
        if word == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name] = value.strip('"')
    return args


def test_dockerfile_is_multistage_devel_then_runtime():
    s = stages()
    assert len(s) >= 2
    assert s[0]["from"] == "${BUILD_IMAGE} AS build"
    assert s[-1]["from"] == "${RUNTIME_IMAGE} AS runtime"
    # The default bases: NVIDIA's devel and runtime images of one CUDA
    # version and distro.
    args = dockerfile_args()
    assert re.match(r"nvidia/cuda:\S+-devel-\S+$", args["BUILD_IMAGE"])
    assert re.match(r"nvidia/cuda:\S+-runtime-\S+$", args["RUNTIME_IMAGE"])
    assert (args["BUILD_IMAGE"].replace("-devel-", "-X-")
            == args["RUNTIME_IMAGE"].replace("-runtime-", "-X-"))


def test_dockerfile_pulls_no_frontend():
    first = DOCKERFILE.read_text(encoding="utf-8").splitlines()[0]
    assert not first.lower().startswith("# syntax")


def test_dockerfile_builds_the_service_alone_with_the_project_script():
    build = stages()[0]
    runs = " ".join(rest for word, rest in build["lines"] if word == "RUN")
    assert "scripts/klserve.sh service" in runs
    assert "deploy/docker/runtime-packages.sh" in runs
    assert (ROOT / "deploy" / "docker" / "runtime-packages.sh").is_file()
    args = [rest for word, rest in build["lines"] if word == "ARG"]
    assert "KLSERVE_CUDA=ON" in args  # the GPU image unless told otherwise


def test_dockerfile_runtime_stage():
    runtime = stages()[-1]["lines"]
    words = [w for w, _ in runtime]
    users = [rest for w, rest in runtime if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    expose = " ".join(rest for w, rest in runtime if w == "EXPOSE").split()
    assert {"50051", "9464"} <= set(expose)
    health = " ".join(rest for w, rest in runtime if w == "HEALTHCHECK")
    assert "klctl" in health and "health" in health
    entry = json.loads(next(rest for w, rest in runtime if w == "ENTRYPOINT"))
    assert entry[0].endswith("/klserve")
    assert "--listen=0.0.0.0:50051" in entry
    copies = [rest for w, rest in runtime if w == "COPY"]
    binaries = [c for c in copies if "/klserve" in c or "/klctl" in c]
    assert binaries and all("--from=build" in c for c in binaries)
    assert "CMD" in words or "ENTRYPOINT" in words
    # Every stage copy refers to a stage defined earlier.
    names = {f["from"].split()[-1] for f in stages()[:-1]}
    for c in copies:
        m = re.search(r"--from=(\S+)", c)
        if m:
            assert m.group(1) in names


def test_healthcheck_start_period_covers_a_gpu_start():
    """Failed checks within the start period do not count: it must last as
    long as the Deployment lets a GPU server start, or a slow CUDA start is
    marked unhealthy."""
    runtime = stages()[-1]["lines"]
    (health,) = [rest for w, rest in runtime if w == "HEALTHCHECK"]
    start = re.search(r"--start-period=(\S+)", health)
    assert start, health
    assert parse_duration(start.group(1)) >= startup_allowance_s()


def run_commands(path):
    """The `docker run` and `podman run` command lines written in a file,
    in comments or code blocks, continuation lines joined."""
    lines = [l.strip().lstrip("#").strip()
             for l in path.read_text(encoding="utf-8").splitlines()]
    text = "\n".join(lines).replace("\\\n", " ")
    return [shlex.split(l) for l in text.splitlines()
            if re.match(r"(docker|podman) run ", l)]


@pytest.mark.parametrize("path", [DOCKERFILE, ROOT / "docs" / "deploy.md"],
                         ids=lambda p: p.name)
def test_run_examples_publish_on_loopback(path):
    """The gRPC port serves plaintext without a token as shipped: an example
    publishing on every interface (-p 50051:50051) opens it to the network."""
    commands = run_commands(path)
    assert commands, f"{path}: no docker run example"
    for argv in commands:
        for i, arg in enumerate(argv):
            value = None
            if arg in ("-p", "--publish"):
                value = argv[i + 1]
            elif arg.startswith("--publish="):
                value = arg.split("=", 1)[1]
            if value is not None:
                assert value.startswith(("127.0.0.1:", "[::1]:")), argv


def test_dockerignore_keeps_build_outputs_out():
    patterns = (ROOT / ".dockerignore").read_text().split()
    for want in (".git", "build", "build-*"):
        assert want in patterns
    # But not the sources the build needs.
    for needed in ("scripts", "server", "client", "kernels", "proto",
                   "tests", "CMakeLists.txt", "deploy"):
        assert needed not in patterns


def image_command():
    """The runtime image's ENTRYPOINT and CMD (both in exec form)."""
    runtime = stages()[-1]["lines"]
    entry = [rest for w, rest in runtime if w == "ENTRYPOINT"]
    cmd = [rest for w, rest in runtime if w == "CMD"]
    return json.loads(entry[-1]), json.loads(cmd[-1]) if cmd else []


def as_list(command):
    """A command as compose or Kubernetes may give it: a list, or a string
    that a shell would split."""
    return shlex.split(command) if isinstance(command, str) else list(command)


def klserve_command_lines():
    """What klserve runs with under each deployment file, as the runtime
    does it: Kubernetes' command and args, and compose's entrypoint and
    command, replace the image's ENTRYPOINT and CMD (a new entrypoint drops
    the CMD too); the Deployment's and the sidecar's ConfigMap flagfile is
    read in."""
    entrypoint, cmd = image_command()

    def kubernetes(c, args_with_flagfile):
        if "command" in c:
            return args_with_flagfile
        return entrypoint + (args_with_flagfile if "args" in c else cmd)

    lines = {"deployment": kubernetes(container(), all_args()),
             "sidecar": kubernetes(sidecar_klserve(), sidecar_args())}
    for path in (COMPOSE, COMPOSE_SHM):
        for name, service in load_all(path)[0]["services"].items():
            if not str(service.get("image", "")).startswith("klserve:"):
                continue
            own = service.get("entrypoint")
            command = service.get("command")
            lines[f"{path.name}:{name}"] = (
                (as_list(own) if own is not None else entrypoint) +
                (as_list(command) if command is not None else
                 [] if own is not None else cmd))
    return lines


# What differs between a node and this machine, given last (the last value
# of a flag wins): loopback addresses, a scratch event directory, the CPU,
# and no credential files (a cluster mounts them).
def local_overrides(tensorboard_dir):
    return ["--listen=127.0.0.1:0", "--metrics_listen=", "--backend=cpu",
            f"--tensorboard_dir={tensorboard_dir}", "--tls_cert=",
            "--tls_key=", "--tls_client_ca=", "--auth_token_file="]


@pytest.mark.skipif(not os.environ.get("KLSERVE_BIN"),
                    reason="KLSERVE_BIN unset (CMake sets it to the build's "
                           "klserve)")
def test_klserve_starts_with_what_each_deployment_file_gives(tmp_path):
    """A renamed flag, a value klserve cannot parse (a byte count in GB) or
    one it refuses (a message limit of 2GiB) would otherwise show only as a
    pod that restarts forever: klserve starts here with each file's
    arguments, only addresses, paths, the backend and credentials swapped
    for this machine's, and serves."""
    for name, line in klserve_command_lines().items():
        assert line and line[0].endswith("/klserve"), (name, line)
        argv = [os.environ["KLSERVE_BIN"], *line[1:],
                *local_overrides(tmp_path / "tensorboard")]
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        try:
            log = []
            for text in server.stderr:
                log.append(text)
                if "serving on port" in text:
                    break
            assert "serving on port" in "".join(log), (name, "".join(log))
        finally:
            server.terminate()
            server.communicate(timeout=60)
