"""compose.yaml, deploy/Dockerfile and deploy/k8s agree with the code.

No Docker engine or cluster runs here, so these files would otherwise rot silently. Every
command must be ``python -m <package>`` with a ``__main__``; every flag and environment
variable must be a field of that service's settings class (and the values must validate);
ports must agree between commands, containers, probes, services and the URLs other services
use; probe paths must be routes the app serves; paths must lie on a mounted volume; files the
Dockerfile copies must exist and include every package the project ships.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from pydantic_settings import BaseSettings

from shared.config import env_var, flag, settings_from_cli

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose.yaml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
K8S_DIR = REPO / "deploy" / "k8s"

SETTINGS_CLASSES = {
    "training_server": ("training_server.config", "TrainingSettings"),
    "prediction_server": ("prediction_server.config", "PredictionSettings"),
    "coalescer": ("coalescer.config", "CoalescerSettings"),
    "stack": ("stack.config", "StackSettings"),
}
# Read by the interpreter or libraries, not by our settings classes.
GENERIC_ENV = {"PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "OMP_NUM_THREADS"}
SERVICE_PREFIXES = ("TRAINING_SERVER_", "PREDICTION_SERVER_", "COALESCER_", "STACK_")


def settings_class(module: str) -> type[BaseSettings]:
    mod_name, cls_name = SETTINGS_CLASSES[module]
    cls = getattr(importlib.import_module(mod_name), cls_name)
    assert issubclass(cls, BaseSettings)
    return cls


@dataclass
class Invocation:
    where: str
    module: str
    args: list[str]
    env: dict[str, str]
    settings: Any

    def arg(self, name: str) -> str:
        return self.args[self.args.index(name) + 1]


def parse_invocation(
    where: str, command: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Invocation:
    """Check ``python -m <pkg> --flags`` plus env against the code and build the settings it yields."""
    command = [str(c) for c in command]
    assert command[:2] == ["python", "-m"], f"{where}: command must be 'python -m <package>': {command}"
    module = command[2]
    assert module in SETTINGS_CLASSES, f"{where}: unknown service module {module!r}"
    assert importlib.util.find_spec(f"{module}.__main__") is not None, f"{where}: {module}.__main__ missing"
    cls = settings_class(module)
    args = command[3:]
    flags = {flag(name) for name in cls.model_fields}
    flags |= {"--no-" + f[2:] for f in flags}
    for token in args:
        if token.startswith("--"):
            assert token.split("=", 1)[0] in flags, f"{where}: {module} has no flag {token}"
    env_names = {env_var(cls, name) for name in cls.model_fields}
    for name in env:
        assert name in env_names or name in GENERIC_ENV, f"{where}: {module} reads no env var {name}"
    with monkeypatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(SERVICE_PREFIXES):
                patch.delenv(name)
        for name, value in env.items():
            patch.setenv(name, str(value))
        try:
            settings = settings_from_cli(cls, args, prog=module)
        except SystemExit as exc:  # argparse/pydantic refused the values
            pytest.fail(f"{where}: {module} rejects {args} with env {env}: exit {exc.code}")
    return Invocation(where, module, args, {k: str(v) for k, v in env.items()}, settings)


def serves(module: str, path: str) -> bool:
    """Whether the service's app routes ``GET path`` (built without its lifespan: the handler
    may fail without its state, but an unrouted path answers 404/405)."""
    cls = settings_class(module)
    app_module = importlib.import_module(f"{module}.app")
    settings = cls.model_validate(
        {"prediction_urls": ["http://127.0.0.1:1"]} if module == "coalescer" else {}
    )
    transport = httpx.ASGITransport(app=app_module.create_app(settings), raise_app_exceptions=False)

    async def get() -> int:
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return (await client.get(path)).status_code

    return asyncio.run(get()) not in (404, 405)


def healthcheck_url(test: list[str]) -> str:
    assert test[0] == "CMD", "healthchecks run a command, not a shell"
    command = test[1:]
    assert command[:3] == ["python", "-m", "stack.healthcheck"], command
    assert importlib.util.find_spec("stack.healthcheck") is not None
    return command[3]


def _under(path: str, mount: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(mount))


# --------------------------------------------------------------------------- compose


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture
def compose_services(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Invocation]:
    return {
        name: parse_invocation(f"compose {name}", svc["command"], svc.get("environment") or {}, monkeypatch)
        for name, svc in compose["services"].items()
    }


def test_compose_runs_each_service_once_from_the_shared_image(
    compose: dict[str, Any], compose_services: dict[str, Invocation]
) -> None:
    modules = sorted(inv.module for inv in compose_services.values())
    assert modules == ["coalescer", "prediction_server", "training_server"]
    assert set(compose["services"]) == set(modules)  # service name = package name
    for name, svc in compose["services"].items():
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile", name
        assert (REPO / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
        assert compose_services[name].settings.host == "0.0.0.0", f"{name} must listen beyond loopback"


def test_compose_ports_and_healthchecks_match_each_service(
    compose: dict[str, Any], compose_services: dict[str, Invocation]
) -> None:
    for name, svc in compose["services"].items():
        port = compose_services[name].settings.port
        url = urlsplit(healthcheck_url(svc["healthcheck"]["test"]))
        assert url.port == port, f"{name}: healthcheck probes {url.port}, service listens on {port}"
        assert url.path == "/readyz", f"{name}: startup must be gated on readiness"
        assert serves(compose_services[name].module, url.path), f"{name}: {url.path} is not served"
        for mapping in svc.get("ports", []):
            assert int(str(mapping).split(":")[-1]) == port, f"{name}: published port {mapping} != {port}"
    # A scaled service cannot publish a fixed host port: replicas would collide.
    assert "ports" not in compose["services"]["prediction_server"]


def test_compose_scales_prediction_and_gates_startup_on_health(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["prediction_server"]["deploy"]["replicas"] >= 2
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert cond == {"condition": "service_healthy"}, f"{name} -> {dep}"
            assert "healthcheck" in services[dep], f"{name} waits for {dep}, which has no healthcheck"
    assert set(services["coalescer"]["depends_on"]) == {"training_server", "prediction_server"}
    assert set(services["prediction_server"]["depends_on"]) == {"training_server"}


def test_compose_coalescer_finds_replicas_by_dns_and_relays_to_training(
    compose_services: dict[str, Invocation],
) -> None:
    coalescer = compose_services["coalescer"].settings
    assert not coalescer.prediction_urls, "replicas come from DNS so scaling just works"
    dns_host, _, dns_port = coalescer.prediction_dns.rpartition(":")
    assert dns_host == "prediction_server"
    assert int(dns_port) == compose_services["prediction_server"].settings.port
    training = urlsplit(coalescer.training_url)
    assert training.hostname == "training_server"
    assert training.port == compose_services["training_server"].settings.port


def test_compose_replicas_read_the_store_the_training_server_writes(
    compose: dict[str, Any], compose_services: dict[str, Invocation]
) -> None:
    def mounts(name: str) -> list[tuple[str, str, str]]:
        out = []
        for spec in compose["services"][name].get("volumes", []):
            source, target, *mode = str(spec).split(":")
            out.append((source, target, mode[0] if mode else "rw"))
        return out

    def volume_path(name: str, path: str) -> tuple[str, PurePosixPath, str]:
        for source, target, mode in mounts(name):
            if _under(path, target):
                assert source in compose["volumes"], f"{name}: {source} is not a named volume"
                return source, PurePosixPath(path).relative_to(target), mode
        raise AssertionError(f"{name}: {path} is on no volume, so it would not persist or be shared")

    training = compose_services["training_server"].settings
    replica = compose_services["prediction_server"].settings
    store_vol, store_sub, store_mode = volume_path("training_server", str(training.store_dir))
    assert store_mode == "rw"
    assert volume_path("training_server", str(training.data_dir))[0] == store_vol
    replica_vol, replica_sub, _ = volume_path("prediction_server", replica.store)
    assert (replica_vol, replica_sub) == (store_vol, store_sub)


def test_compose_requires_an_admin_token_and_passes_it_as_a_file(
    compose: dict[str, Any], compose_services: dict[str, Invocation]
) -> None:
    (secret,) = compose["secrets"].values()
    # ${VAR:?message}: compose refuses to start while the token file is not named.
    assert re.fullmatch(r"\$\{LATENCY_ADMIN_TOKEN_FILE:\?[^}]+\}", secret["file"]), secret
    (secret_name,) = compose["secrets"]
    for name, svc in compose["services"].items():
        assert svc["secrets"] == [secret_name], name
        settings = compose_services[name].settings
        assert settings.auth_token is None, f"{name}: the token must not be written in compose.yaml"
        assert str(settings.auth_token_file) == f"/run/secrets/{secret_name}", name
        assert "--auth-token" not in svc["command"], f"{name}: a token flag is visible in ps"
        for mapping in svc.get("ports", []):
            assert str(mapping).startswith("127.0.0.1:"), f"{name}: {mapping} is published beyond loopback"


# --------------------------------------------------------------------------- Dockerfile


def _dockerfile_instructions() -> Iterator[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            yield keyword.upper(), rest.strip()


def test_dockerfile_copies_every_shipped_package_and_runs_a_real_command(
    compose_services: dict[str, Invocation], monkeypatch: pytest.MonkeyPatch
) -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    shipped = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied: set[str] = set()
    exposed: set[int] = set()
    cmd: list[str] = []
    for keyword, rest in _dockerfile_instructions():
        if keyword == "COPY" and not rest.startswith("--from"):
            *sources, _dest = rest.split()
            for src in sources:
                assert (REPO / src).exists(), f"Dockerfile copies missing {src}"
                copied.add(src)
        elif keyword == "EXPOSE":
            exposed |= {int(p) for p in rest.split()}
        elif keyword == "CMD":
            cmd = yaml.safe_load(rest)  # the exec form is a JSON array
    assert shipped <= copied, f"packages not copied into the image: {shipped - copied}"
    assert {"pyproject.toml", "README.md"} <= copied  # the build needs both
    inv = parse_invocation("Dockerfile CMD", cmd, {}, monkeypatch)
    assert inv.settings.host == "0.0.0.0"
    assert {inv.settings.training_port, inv.settings.coalescer_port} <= exposed
    assert {svc.settings.port for svc in compose_services.values()} <= exposed

    ignore = (REPO / "deploy" / "Dockerfile.dockerignore").read_text().split()
    allowed = {line[1:].removesuffix("/**") for line in ignore if line.startswith("!")}
    assert copied <= allowed, f"excluded from the build context: {copied - allowed}"


# --------------------------------------------------------------------------- Kubernetes


@pytest.fixture(scope="module")
def k8s_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@dataclass
class Workload:
    name: str
    labels: dict[str, str]
    pod: dict[str, Any]
    container: dict[str, Any]
    invocation: Invocation

    def port(self, ref: int | str) -> int:
        for p in self.container["ports"]:
            if ref in (p["containerPort"], p.get("name")):
                return int(p["containerPort"])
        raise AssertionError(f"{self.name}: no container port {ref!r}")


@pytest.fixture
def workloads(k8s_docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> dict[str, Workload]:
    out: dict[str, Workload] = {}
    for doc in k8s_docs:
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        name = doc["metadata"]["name"]
        pod = doc["spec"]["template"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(), name
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        inv = parse_invocation(f"k8s {name}", container["command"], env, monkeypatch)
        out[inv.module] = Workload(name, pod["metadata"]["labels"], pod, container, inv)
    return out


def _service_target(
    docs: list[dict[str, Any]], workloads: dict[str, Workload], host: str, port: int
) -> tuple[dict[str, Any], Workload, int]:
    """The Service named ``host``, the workload it selects, and the container port ``port`` reaches."""
    services = _kind(docs, "Service")
    assert host in services, f"no Service named {host}"
    svc = services[host]
    selected = [w for w in workloads.values() if svc["spec"]["selector"].items() <= w.labels.items()]
    assert len(selected) == 1, f"Service {host} selects {len(selected)} workloads"
    (svc_port,) = [p for p in svc["spec"]["ports"] if p["port"] == port]
    return svc, selected[0], selected[0].port(svc_port.get("targetPort", port))


def test_k8s_runs_the_three_services(workloads: dict[str, Workload]) -> None:
    assert set(workloads) == {"training_server", "prediction_server", "coalescer"}
    for w in workloads.values():
        assert w.invocation.settings.host == "0.0.0.0", w.name
        assert w.port("http") == w.invocation.settings.port, f"{w.name}: containerPort != --port"


def test_k8s_probes_hit_served_paths_on_the_service_port(workloads: dict[str, Workload]) -> None:
    for w in workloads.values():
        assert w.container["readinessProbe"]["httpGet"]["path"] == "/readyz", w.name
        assert w.container["livenessProbe"]["httpGet"]["path"] == "/healthz", w.name
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe in w.container:
                get = w.container[probe]["httpGet"]
                assert serves(w.invocation.module, get["path"]), f"{w.name} {probe}: {get['path']} not served"
                assert w.port(get["port"]) == w.invocation.settings.port
        annotations = w.pod["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            assert int(annotations["prometheus.io/port"]) == w.invocation.settings.port
            assert serves(w.invocation.module, annotations["prometheus.io/path"])


def test_k8s_training_server_keeps_data_and_store_on_a_persistent_volume(
    k8s_docs: list[dict[str, Any]], workloads: dict[str, Workload]
) -> None:
    w = workloads["training_server"]
    claims = _kind(k8s_docs, "PersistentVolumeClaim")
    volumes = {v["name"]: v for v in w.pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in w.container["volumeMounts"]}
    settings = w.invocation.settings
    for path in (settings.data_dir, settings.store_dir):
        mount = [m for m in mounts if _under(str(path), m)]
        assert mount, f"{path} is on no volume"
        volume = volumes[mounts[mount[0]]]
        assert volume["persistentVolumeClaim"]["claimName"] in claims
    assert w.pod["spec"].get("securityContext", {}).get("fsGroup") is not None  # the volume is writable


def test_k8s_replicas_pull_the_store_over_http_from_the_training_service(
    k8s_docs: list[dict[str, Any]], workloads: dict[str, Workload]
) -> None:
    w = workloads["prediction_server"]
    store = urlsplit(w.invocation.settings.store)
    assert store.scheme == "http", "no volume spans the nodes: replicas pull the store over HTTP"
    assert store.hostname is not None and store.port is not None
    _, target, port = _service_target(k8s_docs, workloads, store.hostname, store.port)
    assert target.name == workloads["training_server"].name
    assert port == workloads["training_server"].invocation.settings.port
    cache_dir = w.invocation.settings.cache_dir
    if cache_dir is not None:
        mounts = [m["mountPath"] for m in w.container["volumeMounts"]]
        assert any(_under(str(cache_dir), m) for m in mounts), "the cache dir must be on a mounted volume"


def test_k8s_coalescer_discovers_replicas_through_a_headless_service(
    k8s_docs: list[dict[str, Any]], workloads: dict[str, Workload]
) -> None:
    settings = workloads["coalescer"].invocation.settings
    host, _, port = settings.prediction_dns.rpartition(":")
    svc, target, container_port = _service_target(k8s_docs, workloads, host, int(port))
    assert svc["spec"].get("clusterIP") == "None", "discovery needs one DNS record per replica"
    assert target.invocation.module == "prediction_server"
    assert container_port == target.invocation.settings.port
    training = urlsplit(settings.training_url)
    assert training.hostname is not None and training.port is not None
    _, relay_target, relay_port = _service_target(k8s_docs, workloads, training.hostname, training.port)
    assert relay_target.invocation.module == "training_server"
    assert relay_port == relay_target.invocation.settings.port
    # The front door itself is reachable through a Service on its port.
    _, front, _ = _service_target(k8s_docs, workloads, "coalescer", settings.port)
    assert front.invocation.module == "coalescer"


def test_k8s_autoscaler_targets_the_prediction_deployment(
    k8s_docs: list[dict[str, Any]], workloads: dict[str, Workload]
) -> None:
    (hpa,) = _kind(k8s_docs, "HorizontalPodAutoscaler").values()
    target = hpa["spec"]["scaleTargetRef"]
    w = workloads["prediction_server"]
    assert (target["kind"], target["name"]) == ("Deployment", w.name)
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    # Utilisation targets are relative to requests: without a CPU request the HPA cannot act.
    assert "cpu" in w.container["resources"]["requests"]


def test_k8s_every_manifest_is_in_the_kustomization() -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    files = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    images = {i["name"] for i in kustomization.get("images", [])}
    for path in K8S_DIR.glob("*.yaml"):
        for image in re.findall(r"image:\s*(\S+)", path.read_text()):
            assert image.split(":")[0] in images, f"{path.name}: image {image} not managed by kustomize"


def test_k8s_admin_token_is_a_generated_secret_mounted_as_a_file(
    k8s_docs: list[dict[str, Any]], workloads: dict[str, Workload]
) -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    (generator,) = kustomization["secretGenerator"]
    (token_file,) = generator["files"]
    # The token is the operator's: generated before the first apply, never committed.
    assert token_file in (REPO / ".gitignore").read_text()
    assert not _kind(k8s_docs, "Secret"), "a Secret written in the repository is no secret"
    for w in workloads.values():
        settings = w.invocation.settings
        assert settings.auth_token is None and "--auth-token" not in w.container["command"], w.name
        volumes = {v["name"]: v for v in w.pod["spec"]["volumes"]}
        mounts = [m for m in w.container["volumeMounts"] if volumes[m["name"]].get("secret")]
        (mount,) = mounts
        assert volumes[mount["name"]]["secret"]["secretName"] == generator["name"], w.name
        assert mount.get("readOnly") is True, w.name
        assert PurePosixPath(str(settings.auth_token_file)) == PurePosixPath(mount["mountPath"]) / token_file
        # The file is group-readable only: the pod's group must own it.
        assert (
            w.pod["spec"]["securityContext"].get("fsGroup") == w.pod["spec"]["securityContext"]["runAsUser"]
        )


SCHEDULER = {"latency-model-services/access": "scheduler"}
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}


def test_k8s_network_policy_admits_only_the_scheduler_and_the_stack_itself(
    k8s_docs: list[dict[str, Any]], workloads: dict[str, Workload]
) -> None:
    policies = list(_kind(k8s_docs, "NetworkPolicy").values())

    def admitted(w: Workload) -> list[tuple[str, frozenset[tuple[str, str]], tuple[int, ...]]]:
        (policy,) = [
            p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= w.labels.items()
        ]
        assert policy["spec"]["policyTypes"] == ["Ingress"], w.name
        out = []
        for rule in policy["spec"]["ingress"]:
            ports = tuple(sorted(int(p["port"]) for p in rule["ports"]))
            for peer in rule["from"]:
                ((kind, selector),) = peer.items()
                out.append((kind, frozenset(selector["matchLabels"].items()), ports))
        return out

    def pods(*labels: dict[str, str]) -> set[frozenset[tuple[str, str]]]:
        return {frozenset(lab.items()) for lab in labels}

    name = {m: {"app.kubernetes.io/name": workloads[m].labels["app.kubernetes.io/name"]} for m in workloads}
    expected = {
        "coalescer": pods(SCHEDULER),
        "prediction_server": pods(name["coalescer"]),
        "training_server": pods(SCHEDULER, name["coalescer"], name["prediction_server"]),
    }
    for module, w in workloads.items():
        rules = admitted(w)
        port = w.invocation.settings.port
        assert all(ports == (port,) for _, _, ports in rules), f"{w.name}: only its service port"
        assert {sel for kind, sel, _ in rules if kind == "podSelector"} == expected[module], w.name
        assert {sel for kind, sel, _ in rules if kind == "namespaceSelector"} == pods(MONITORING), w.name


def test_k8s_kustomize_renders_the_secret_and_the_policies(tmp_path: Path) -> None:
    """``kubectl kustomize`` on a copy with a token file: what ``kubectl apply -k`` would send."""
    import shutil
    import subprocess

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    copy = tmp_path / "k8s"
    shutil.copytree(K8S_DIR, copy)
    (copy / "admin-token").write_text("a-generated-token\n")
    out = subprocess.run([kubectl, "kustomize", str(copy)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    (secret,) = _kind(docs, "Secret").values()
    assert set(secret["data"]) == {"admin-token"}
    for deployment in _kind(docs, "Deployment").values():
        names = {
            v.get("secret", {}).get("secretName") for v in deployment["spec"]["template"]["spec"]["volumes"]
        }
        assert secret["metadata"]["name"] in names  # the hashed name is rewritten into every pod
    assert len(_kind(docs, "NetworkPolicy")) == 3
    (tmp_path / "k8s" / "admin-token").unlink()  # without the token file, nothing renders
    out = subprocess.run([kubectl, "kustomize", str(copy)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


# --------------------------------------------------------------------------- local stack


def test_local_stack_commands_and_env_exist_in_the_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from stack.config import StackSettings
    from stack.launcher import child_env, plan

    settings = StackSettings.model_validate(
        {"data_dir": tmp_path, "replicas": 3, "base_port": 9100, "workers": 2}
    )
    env = child_env(settings, {})
    specs = plan(settings)
    invocations = {}
    for spec in specs:
        argv = ["python", "-m", spec.module, "--host", settings.host, "--port", str(spec.port), *spec.args]
        prefix = SETTINGS_CLASSES[spec.module][0].split(".")[0].upper() + "_"
        service_env = {k: v for k, v in env.items() if k.startswith(prefix)}
        invocations[spec.name] = parse_invocation(f"stack {spec.name}", argv, service_env, monkeypatch)
    assert len({spec.port for spec in specs}) == len(specs) == 5
    training = invocations["training_server"].settings
    coalescer = invocations["coalescer"].settings
    replicas = [inv.settings for name, inv in invocations.items() if name.startswith("prediction_server")]
    assert all(Path(r.store) == training.store_dir for r in replicas)
    assert coalescer.prediction_urls == [f"http://127.0.0.1:{r.port}" for r in replicas]
    assert coalescer.training_url == f"http://127.0.0.1:{training.port}"
    assert coalescer.eager_inflight_per_replica == 2 == replicas[0].workers
    # The user's environment wins over the stack's defaults; the stack's own variables are forced.
    env = child_env(settings, {"COALESCER_EAGER_INFLIGHT_PER_REPLICA": "1", "PYTHONPATH": "/x"})
    assert env["COALESCER_EAGER_INFLIGHT_PER_REPLICA"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO), "/x"] and env["PYTHONUNBUFFERED"] == "1"
