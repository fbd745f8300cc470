"""`gpupool status` (text): the line on the backend, said for a cluster or when something is wrong."""

from __future__ import annotations

from gpupool.cli.tables import status_text

POOL = {"simulated": False, "nodes": []}


def test_the_local_backend_says_nothing_when_well_and_a_cluster_says_where_and_how():
    local = status_text("http://x", {"pool": POOL, "backend": {"backend": "local", "ok": True}})
    assert "backend" not in local and "Kubernetes" not in local
    ok = status_text("http://x", {"pool": POOL, "backend": {
        "backend": "kubernetes", "ok": True, "errors": [], "api_server": "https://10.0.0.1:6443",
        "namespace": "ml", "nodes_out": {}}})
    assert ok.splitlines()[1] == "Kubernetes API https://10.0.0.1:6443, namespace ml: OK"
    down = status_text("http://x", {"pool": POOL, "backend": {
        "backend": "kubernetes", "ok": False, "api_server": "https://10.0.0.1:6443", "namespace": "ml",
        "errors": [{"source": "nodes watch", "error": "connection refused", "since": 1_700_000_000}],
        "nodes_out": {"gpu-3": "cordoned"}}})
    lines = down.splitlines()
    assert lines[1].startswith("Kubernetes API https://10.0.0.1:6443, namespace ml: PROBLEM: nodes watch: "
                               "connection refused (since ")
    assert lines[2] == "nodes out of the pool: gpu-3 (cordoned)"
