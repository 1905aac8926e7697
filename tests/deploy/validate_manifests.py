"""Checks of the deployment files under deploy/ (no Docker or cluster needed).

Every YAML file under deploy/ must parse (all of its documents); then the
fields the deployment relies on are checked: the Kubernetes Deployment
(GPU request, probes, grace period longer than --drain_timeout, non-root),
the headless Service, the PodMonitor's port, the kustomization's files, the
compose services and their mounts, and the Dockerfile's stages. Where the
kubernetes-validate package is importable, the built-in Kubernetes kinds are
also validated against the OpenAPI schema (strict: unknown fields fail).

    python -m pytest -q tests/deploy/validate_manifests.py
"""

import json
import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
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


def flag(args, name):
    """The value of --name=VALUE in args, or None."""
    values = [a.split("=", 1)[1] for a in args
              if a.startswith(f"--{name}=")]
    assert len(values) <= 1, f"--{name} given twice"
    return values[0] if values else None


# ---------------------------------------------------------------- all YAML

def test_there_are_yaml_files():
    names = {p.relative_to(DEPLOY).as_posix() for p in yaml_files()}
    for want in ("compose/compose.yaml", "k8s/kustomization.yaml",
                 "k8s/deployment.yaml", "k8s/service.yaml",
                 "k8s/podmonitor.yaml", "prometheus/prometheus.yml"):
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


# ---------------------------------------------------------------- kubernetes

def container():
    deployment = one("Deployment", "klserve")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def all_args():
    """The container's args plus the flags of the ConfigMap's flagfile."""
    c = container()
    args = list(c.get("command", [])) + list(c.get("args", []))
    flagfile = flag(args, "flagfile")
    if flagfile:
        pod = one("Deployment", "klserve")["spec"]["template"]["spec"]
        mount = next(m for m in c["volumeMounts"]
                     if flagfile.startswith(m["mountPath"].rstrip("/") + "/"))
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        cm = one("ConfigMap", volume["configMap"]["name"])
        key = flagfile[len(mount["mountPath"].rstrip("/")) + 1:]
        assert key in cm["data"], f"flagfile {flagfile}: no key {key}"
        args += [l.strip() for l in cm["data"][key].splitlines()
                 if l.strip() and not l.strip().startswith("#")]
    return args


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
    for path, doc in k8s_objects():
        if doc["apiVersion"] in ("monitoring.coreos.com/v1",
                                 "kustomize.config.k8s.io/v1beta1"):
            continue  # CRDs / kustomize config: no schema bundled
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{path.name} {doc['kind']}: {e.message} "
                        f"at {list(e.path)}")
        checked += 1
    assert checked >= 3


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


def test_compose_mounts_exist():
    services = compose()["services"]
    named = set(compose().get("volumes", {}) or {})
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                path = (COMPOSE.parent / source).resolve()
                assert path.exists(), f"{name}: {source} does not exist"
                assert ROOT in path.parents, f"{name}: {source} outside repo"
            else:
                assert source in named, f"{name}: volume {source} undeclared"


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


def test_dockerignore_keeps_build_outputs_out():
    patterns = (ROOT / ".dockerignore").read_text().split()
    for want in (".git", "build", "build-*"):
        assert want in patterns
    # But not the sources the build needs.
    for needed in ("scripts", "server", "client", "kernels", "proto",
                   "tests", "CMakeLists.txt", "deploy"):
        assert needed not in patterns
