"""`gpupool node-agent` as a DaemonSet runs it: a real process against the real API server.

It writes the node's exact GPUs to ``gpupool.io/gpus``; `gpupool serve
--backend kubernetes` then shows those UUIDs, models and NVLink groups, and a
job's pod gets the UUIDs in ``NVIDIA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, utils

from gpupool.inventory.simulated import SimulatedInventory
from tests.kube.cluster import Kubelet, pod_env, wait
from tests.kube.test_deploy import documents, ensure_namespace
from tests.kube.test_serve_cli import gpupool, serve

ANNOTATION = "gpupool.io/gpus"


def agent(kubeconfig: Path, node: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpupool", "node-agent", "--kubeconfig", str(kubeconfig),
                             "--node", node, *args], env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def agent_once(kubeconfig: Path, node: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpupool", "node-agent", "--kubeconfig", str(kubeconfig),
                           "--node", node, "--once", *args], capture_output=True, text=True, timeout=60)


def annotation(api: Any, node: str) -> str | None:
    return (api.read_node(node).metadata.annotations or {}).get(ANNOTATION)


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM (as the kubelet stops a pod), its exit status checked; its stderr."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    return err


def kubeconfig_as(kubeconfig: Path, tmp_path: Path, *, token: str | None = None, context: str | None = None,
                  server: str | None = None) -> Path:
    """A copy of the test kubeconfig as another user (a token, or the kit's ``limited`` context) or server."""
    cfg = yaml.safe_load(kubeconfig.read_text())
    if context:
        cfg["current-context"] = context
    if token:
        cluster = cfg["contexts"][0]["context"]["cluster"]
        cfg["users"] = [{"name": "sa", "user": {"token": token}}]
        cfg["contexts"] = [{"name": "sa", "context": {"cluster": cluster, "user": "sa"}}]
        cfg["current-context"] = "sa"
    if server:
        for c in cfg["clusters"]:
            c["cluster"]["server"] = server
    out = tmp_path / f"kubeconfig-{len(list(tmp_path.glob('kubeconfig-*')))}"
    out.write_text(yaml.safe_dump(cfg))
    return out


def test_the_agent_annotates_its_node_and_serve_shows_those_gpus(api: Any, namespace: str, gpu_nodes: Any,
                                                                   kubeconfig: Path, tmp_path: Path) -> None:
    n1, n2 = gpu_nodes(2, gpus=4)
    proc = agent(kubeconfig, n1, "--simulate", "4xA100-80GB", "--interval", "0.3")
    try:
        text = wait(lambda: annotation(api, n1), what="the agent's annotation on the node")
        expected = SimulatedInventory("4xA100-80GB", node=n1).gpus()
        assert json.loads(text) == [{"id": g.id, "index": g.index, "model": "A100-80GB", "memory": 80 * 1024 ** 3,
                                     "topology_group": g.topology_group} for g in expected]
        assert annotation(api, n2) is None  # only its own node

        # Patched only on change: a quiet interval writes nothing (the node's resourceVersion stays).
        rv = api.read_node(n1).metadata.resource_version
        time.sleep(1.5)  # five intervals
        assert api.read_node(n1).metadata.resource_version == rv

        server, url = serve(tmp_path, "--backend", "kubernetes", "--kubeconfig", str(kubeconfig),
                            "--namespace", namespace)
        try:
            status = wait(lambda: (s := gpupool(url, "status")) and len(s["pool"]["nodes"]) == 2 and s,
                          what="both nodes in gpupool status")
            shown = {n["name"]: n["gpus"] for n in status["pool"]["nodes"]}
            assert [(g["id"], g["index"], g["model"], g["topology_group"]) for g in shown[n1]] == [
                (g.id, g.index, "A100-80GB", g.topology_group) for g in expected]
            assert [g["id"] for g in shown[n2]] == [f"{n2}/gpu{i}" for i in range(4)]  # no agent there
            pool = gpupool(url, "status")["pool"]
            assert pool == status["pool"]

            # Someone overwrites the annotation: the agent puts it back at its next check.
            api.patch_node(n1, {"metadata": {"annotations": {ANNOTATION: "[]"}}})
            wait(lambda: annotation(api, n1) == text, what="the annotation restored")

            # A job on n1 sees the exact GPUs by UUID.
            gpupool(url, "projects", "set", "vision", "--guarantee", "8")
            api.patch_node(n2, {"spec": {"unschedulable": True}})  # only n1 takes work
            job = gpupool(url, "submit", "--project", "vision", "--gpus", "2", "--", "python", "train.py")
            with Kubelet(api, namespace) as kubelet:
                name = f"gpupool-{job['id']}-1"
                wait(lambda: name in kubelet.started, what="the job's pod running")
                env = pod_env(api.read_namespaced_pod(name, namespace))
                ids = env["NVIDIA_VISIBLE_DEVICES"].split(",")
                assert len(ids) == 2 and set(ids) <= {g.id for g in expected}
                assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"]
        finally:
            server.terminate()
            server.wait(20)
    finally:
        err = stop(proc)
    assert err.count(f"node {n1}: wrote {ANNOTATION}") == 2, err  # the first write and the restore only


def test_the_deploy_rbac_is_enough_for_the_agent_and_no_more(api: Any, gpu_nodes: Any, kubeconfig: Path,
                                                              tmp_path: Path) -> None:
    ensure_namespace(api)
    for doc in documents("node-agent-rbac.yaml"):
        utils.create_from_dict(api.api_client, doc)
    try:
        agent_with_deploy_rbac(api, gpu_nodes, kubeconfig, tmp_path)
    finally:  # test_deploy's dry run of the same objects must not meet these
        rbac = client.RbacAuthorizationV1Api(api.api_client)
        api.delete_namespaced_service_account("gpupool-node-agent", "gpupool")
        rbac.delete_cluster_role_binding("gpupool-node-agent")
        rbac.delete_cluster_role("gpupool-node-agent")


def agent_with_deploy_rbac(api: Any, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    (node,) = gpu_nodes(1, gpus=2)
    token = api.create_namespaced_service_account_token(
        "gpupool-node-agent", "gpupool", client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token
    sa = kubeconfig_as(kubeconfig, tmp_path, token=token)
    as_sa = client.CoreV1Api(config.new_client_from_config(config_file=str(sa)))

    def rbac_in_effect() -> bool:  # the API server's RBAC cache takes a moment to see new roles
        try:
            as_sa.read_node(node)
        except client.ApiException:
            return False
        return True

    wait(rbac_in_effect, what="the agent's role in effect")
    r = agent_once(sa, node, "--simulate", "2xH100-80GB")
    assert r.returncode == 0, r.stderr
    assert [g["model"] for g in json.loads(annotation(api, node) or "[]")] == ["H100-80GB", "H100-80GB"]
    for call in (lambda: as_sa.list_namespaced_pod("gpupool"), lambda: as_sa.delete_node(node),
                 lambda: as_sa.list_node()):
        try:
            call()
        except client.ApiException as e:
            assert e.status == 403
        else:
            raise AssertionError("the node agent's service account may do more than get and patch nodes")


def test_a_node_that_does_not_exist_is_a_clear_error(kubeconfig: Path) -> None:
    r = agent_once(kubeconfig, "no-such-node", "--simulate", "1xT4")
    assert r.returncode == 1
    assert "node 'no-such-node' does not exist" in r.stderr and "Traceback" not in r.stderr


def test_a_refusal_by_rbac_is_a_clear_error(api: Any, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    (node,) = gpu_nodes(1, gpus=1)
    limited = kubeconfig_as(kubeconfig, tmp_path, context="limited")  # the kit's user with no rights
    proc = agent(limited, node, "--simulate", "1xT4", "--interval", "0.2")
    _, err = proc.communicate(timeout=60)  # exits at once: waiting will not grant the right
    assert proc.returncode == 1, err
    assert f"refused to read or patch node '{node}' (HTTP 403)" in err and "Traceback" not in err
    assert annotation(api, node) is None


def test_an_unreachable_api_server_is_retried_with_backoff_until_stopped(kubeconfig: Path, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    away = kubeconfig_as(kubeconfig, tmp_path, server=f"https://127.0.0.1:{port}")
    log = tmp_path / "agent.err"
    with open(log, "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "gpupool", "node-agent", "--kubeconfig", str(away),
                                 "--node", "n1", "--simulate", "1xT4", "--interval", "0.2"],
                                stdout=subprocess.DEVNULL, stderr=err_file, text=True)

    def delays() -> list[float]:
        return [float(line.split("retrying in ")[1].split()[0]) for line in log.read_text().splitlines()
                if "retrying in" in line]

    try:
        wait(lambda: len(delays()) >= 3, timeout=60, what="three retries")
        assert proc.poll() is None, log.read_text()  # still waiting, not crashed
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    assert proc.returncode == 0, log.read_text()
    assert delays()[:3] == [0.5, 1.0, 2.0], log.read_text()  # backing off, not hammering
    assert "Traceback" not in log.read_text()


def test_usage_mistakes_exit_2_with_a_message(kubeconfig: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    r = subprocess.run([sys.executable, "-m", "gpupool", "node-agent", "--kubeconfig", str(kubeconfig),
                        "--simulate", "1xT4"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "needs --node NAME or $NODE_NAME" in r.stderr
    r = agent_once(kubeconfig, "n1", "--simulate", "3xNOPE")
    assert r.returncode == 2 and "unknown GPU model 'NOPE'" in r.stderr
    r = agent_once(kubeconfig, "n1", "--interval", "0")
    assert r.returncode == 2 and "--interval must be above 0" in r.stderr
