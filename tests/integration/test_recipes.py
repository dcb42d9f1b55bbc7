"""The deployment recipes in docs/recipes/ (Kubernetes, Consul, BGP) are
checked as far as a machine without a cluster, a Consul agent or routers
allows: every file parses, the sluice configuration each embeds passes
`sluice -t`, and the pieces agree with each other and with that
configuration (ports, probe paths, mount paths, DNS names, timings). The
BGP files are run for real by test_multi_instance.py.

What is not run here: a Kubernetes cluster (the kubelet's probes, the
ConfigMap's update, kube-proxy, the cloud balancer) and a Consul agent
(its check, its DNS). docs/recipes/kubernetes/README.md and
docs/recipes/consul.md say so too.

`sluice -t` asks DNS for the discovered servers' names; it runs in a
network namespace of its own with no interface up, so no query leaves the
machine (each such entry gives the warning that `-t` prints for a name that
does not answer, and the exit status stays 0)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

import harness

yaml = pytest.importorskip("yaml", reason="python3-yaml is not installed (tools/setup.sh installs it)")

DOCS = Path(__file__).resolve().parents[2] / "docs"
K8S = DOCS / "recipes" / "kubernetes"
CONSUL = DOCS / "recipes" / "consul"
BGP = DOCS / "recipes" / "bgp"


def seconds(duration: str) -> float:
    """A sluice duration ("250ms", "10s", "5m", "1h") in seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration)
    assert m, duration
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def check_offline(config_text: str, tmp_path: Path, name: str = "recipe.toml") -> subprocess.CompletedProcess:
    """`sluice -t` on `config_text`, in a network namespace with nothing up."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    path = tmp_path / name
    path.write_text(config_text)
    res = subprocess.run(["unshare", "--net", str(harness.sluice_bin()), "-t", "-c", str(path)],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    if res.returncode != 0 and "unshare failed" in res.stderr:
        pytest.skip(f"cannot make a network namespace here: {res.stderr.strip()}")
    return res


# --------------------------------------------------------------------------
# Kubernetes
# --------------------------------------------------------------------------

def k8s_objects() -> dict[tuple[str, str], dict]:
    objs = {}
    for f in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc is None:
                continue
            assert {"apiVersion", "kind", "metadata"} <= doc.keys(), (f.name, doc.keys())
            objs[(doc["kind"], doc["metadata"]["name"])] = doc
    return objs


@pytest.fixture(scope="module")
def k8s():
    objs = k8s_objects()
    kinds = sorted(k for k, _ in objs)
    assert kinds == ["ConfigMap", "Deployment", "Service", "Service"], kinds
    deploy = next(v for (k, _), v in objs.items() if k == "Deployment")
    cm = next(v for (k, _), v in objs.items() if k == "ConfigMap")
    services = [v for (k, _), v in objs.items() if k == "Service"]
    lb = next(s for s in services if s["spec"].get("type") == "LoadBalancer")
    headless = next(s for s in services if s["spec"].get("clusterIP") == "None")
    namespaces = {o["metadata"].get("namespace") for o in objs.values()}
    assert len(namespaces) == 1 and None not in namespaces, namespaces
    pod = deploy["spec"]["template"]
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "sluice"]
    args = container["args"]
    assert args[0] == "-c", args
    config_path = args[1]
    return {"deploy": deploy, "pod": pod, "container": container, "cm": cm, "lb": lb, "headless": headless,
            "ns": namespaces.pop(), "config_path": config_path}


def mount_for(k8s, path: str) -> tuple[dict, dict]:
    """The volumeMount whose directory holds `path`, and its volume."""
    mounts = [m for m in k8s["container"]["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert len(mounts) == 1, (path, k8s["container"]["volumeMounts"])
    (vol,) = [v for v in k8s["pod"]["spec"]["volumes"] if v["name"] == mounts[0]["name"]]
    return mounts[0], vol


def embedded_config(k8s) -> tuple[str, dict]:
    mount, vol = mount_for(k8s, k8s["config_path"])
    assert vol.get("configMap", {}).get("name") == k8s["cm"]["metadata"]["name"], vol
    # A subPath mount is never updated: watch_config would never see a change.
    assert "subPath" not in mount, mount
    key = k8s["config_path"][len(mount["mountPath"].rstrip("/")) + 1:]
    text = k8s["cm"]["data"][key]
    return text, tomllib.loads(text)


def named_port(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    (p,) = [p for p in container["ports"] if p["name"] == port]
    return p["containerPort"]


def test_kubernetes_configmap_passes_sluice_check(k8s, tmp_path):
    text, conf = embedded_config(k8s)
    assert conf["global"]["watch_config"] is True
    # The admin token comes from a Secret mounted where token_file says.
    token_file = conf["admin"]["token_file"]
    mount, vol = mount_for(k8s, token_file)
    assert "secret" in vol, vol
    local = tmp_path / "token"
    local.write_text("k8s-recipe-token\n")
    res = check_offline(text.replace(token_file, str(local)), tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "is valid" in res.stdout, res.stdout
    # The SRV entry was read as one (and asked for, with no network here).
    services = [s["service"] for u in conf["upstream"].values() for s in u["servers"] if "service" in s]
    assert services and all(f"SRV {name} gives no server now" in res.stderr for name in services), res.stderr


def test_kubernetes_probes_ports_and_services_agree_with_the_config(k8s):
    _, conf = embedded_config(k8s)
    c = k8s["container"]
    admin_port = port_of(conf["admin"]["listen"])
    assert named_port(c, c["readinessProbe"]["httpGet"]["port"]) == admin_port
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    # Liveness on the admin port, not on /ready (503 during a drain).
    live = c["livenessProbe"]
    assert "tcpSocket" in live and named_port(c, live["tcpSocket"]["port"]) == admin_port, live
    listen_ports = {port_of(l["listen"]) for l in conf["listener"]}
    container_ports = {p["containerPort"] for p in c["ports"]}
    assert listen_ports | {admin_port} <= container_ports, (listen_ports, container_ports)
    # The LoadBalancer Service selects these pods and sends to a listener.
    lb = k8s["lb"]
    labels = k8s["pod"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in lb["spec"]["selector"].items()), (lb["spec"]["selector"], labels)
    assert lb["spec"]["selector"] == k8s["deploy"]["spec"]["selector"]["matchLabels"]
    for p in lb["spec"]["ports"]:
        assert named_port(c, p["targetPort"]) in listen_ports, p
        assert named_port(c, p["targetPort"]) != admin_port, "the admin API must not be on the load balancer"


def test_kubernetes_headless_service_feeds_the_srv_entry(k8s):
    _, conf = embedded_config(k8s)
    h = k8s["headless"]
    services = [s["service"] for u in conf["upstream"].values() for s in u["servers"] if "service" in s]
    assert services, "no { service = ... } entry in the ConfigMap's configuration"
    names = {f"_{p['name']}._{p.get('protocol', 'TCP').lower()}.{h['metadata']['name']}.{k8s['ns']}.svc.cluster.local"
             for p in h["spec"]["ports"]}
    assert set(services) <= names, (services, names)


def test_kubernetes_timings_cover_the_stop(k8s):
    _, conf = embedded_config(k8s)
    g = conf["global"]
    delay, timeout = seconds(g["shutdown_delay"]), seconds(g["shutdown_timeout"])
    spread = seconds(g.get("close_spread", "0s"))
    pre = k8s["container"]["lifecycle"]["preStop"]
    if "exec" in pre:
        cmd = pre["exec"]["command"]
        assert cmd[0] == "sleep", cmd
        pre_s = float(cmd[1])
    else:
        pre_s = float(pre["sleep"]["seconds"])
    grace = k8s["pod"]["spec"]["terminationGracePeriodSeconds"]
    assert pre_s >= delay, (pre_s, delay)
    assert grace >= delay + timeout, (grace, delay, timeout)
    # The grace period runs from the preStop hook's start: it must cover the
    # hook, then sluice's own delay, timeout and spread, or the kubelet's
    # SIGKILL cuts whatever is left.
    assert grace >= pre_s + delay + timeout + spread, (grace, pre_s, delay, timeout, spread)
    drains = [seconds(u["drain_timeout"]) for u in conf["upstream"].values() if "drain_timeout" in u]
    print(f"\nKubernetes recipe: preStop {pre_s:.0f} s + shutdown_delay {delay:.0f} s + shutdown_timeout "
          f"{timeout:.0f} s + close_spread {spread:.0f} s = {pre_s + delay + timeout + spread:.0f} s "
          f"<= terminationGracePeriodSeconds {grace}; drain_timeout {drains}")


# --------------------------------------------------------------------------
# Consul
# --------------------------------------------------------------------------

def test_consul_registration_and_config_agree(tmp_path):
    reg = json.loads((CONSUL / "sluice-service.json").read_text())["service"]
    text = (CONSUL / "sluice.toml").read_text()
    conf = tomllib.loads(text)
    res = check_offline(text, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "is valid" in res.stdout, res.stdout
    check = reg["check"]
    m = re.fullmatch(r"http://([^/]+)(/.*)", check["http"])
    assert m and m.group(2) == "/ready", check["http"]
    assert m.group(1) == conf["admin"]["listen"], (m.group(1), conf["admin"]["listen"])
    assert reg["port"] in {port_of(l["listen"]) for l in conf["listener"]}
    # Servers from Consul DNS, through the local agent.
    assert conf["resolver"]["nameservers"] == ["127.0.0.1:8600"]
    services = [s["service"] for u in conf["upstream"].values() for s in u["servers"] if "service" in s]
    assert services and all(s.endswith(".service.consul") for s in services), services
    # Taken out with a notice longer than Consul's check needs to fail it.
    interval = seconds(check["interval"]) + seconds(check["timeout"])
    assert seconds(conf["global"]["shutdown_delay"]) > interval, (conf["global"]["shutdown_delay"], interval)
    doc = (DOCS / "recipes" / "consul.md").read_text()
    assert (CONSUL / "sluice-service.json").read_text().strip() in doc


# --------------------------------------------------------------------------
# BGP: the files test_multi_instance.py runs are the ones the docs show
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["bird-instance.conf", "bird-router.conf", "exabgp.conf"])
def test_scale_out_page_shows_the_tested_bgp_files(name):
    text = (BGP / name).read_text().strip()
    assert text in (DOCS / "scale-out.md").read_text(), f"docs/scale-out.md does not show {name} as it is"


def test_bird_files_parse():
    if shutil.which("bird") is None:
        pytest.skip("bird is not installed (tools/setup.sh installs bird2)")
    for name in ("bird-instance.conf", "bird-router.conf"):
        res = subprocess.run(["bird", "-p", "-c", str(BGP / name)], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, (name, res.stderr)
