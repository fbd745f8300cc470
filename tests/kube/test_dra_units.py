"""DRA pieces without a cluster: slices read into devices and GPUs, a pod's claims read into what it asks for,
selectors, and the chosen devices dealt to the claims' requests (tests/kube/test_dra_claims.py runs them whole)."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.backends.kubernetes.dra_allocation import results_for, with_affinity
from gpupool.backends.kubernetes.dra_cel import SelectorError, compile_selector, matches
from gpupool.backends.kubernetes.dra_claims import ClaimProblem, kind_check, read_ask
from gpupool.backends.kubernetes.dra_slices import DRA_NODE_LABEL, Device, DraNode, gpu_of, kind_of, newest
from gpupool.backends.kubernetes.nodes import read_node

CLASS = {"metadata": {"name": "gpu.nvidia.com"}, "spec": {"selectors": [{"cel": {"expression":
         "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}


def a_slice(node: str, gpus: int, product: str = "NVIDIA H100 80GB HBM3", memory: str = "80Gi",
            generation: int = 1, mig: int = 0) -> dict[str, Any]:
    devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "index": {"int": i},
                                                   "uuid": {"string": f"GPU-{node}-{i}"},
                                                   "productName": {"string": product}},
                "capacity": {"memory": {"value": memory}}} for i in range(gpus)]
    devices += [{"name": f"mig-{i}", "attributes": {"type": {"string": "mig"}}} for i in range(mig)]
    return {"metadata": {"name": f"{node}-{generation}"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": generation}, "devices": devices}}


def claim(name: str, *requests: dict[str, Any], reserved: list[dict[str, Any]] | None = None,
          **devices: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": list(requests), **devices}},
            "status": {"reservedFor": reserved} if reserved else {}}


def exactly(name: str = "gpu", count: int | None = 1, *selectors: str, cls: str = "gpu.nvidia.com") -> dict[str, Any]:
    ex: dict[str, Any] = {"deviceClassName": cls}
    if count is None:
        ex["allocationMode"] = "All"
    else:
        ex["count"] = count
    if selectors:
        ex["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": ex}


def pod(*claims: str, uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": uid},
            "spec": {"resourceClaims": [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]}}


DEVICES = newest({"a": a_slice("h1", 8), "b": a_slice("h2", 8), "c": a_slice("small", 2, "NVIDIA A100-SXM4-40GB",
                                                                                 "40Gi")})
CHECK = kind_check(DEVICES)


def test_slices_become_devices_and_gpus_newest_generation_only_and_no_mig() -> None:
    got = newest({"old": a_slice("n", 4, generation=1), "new": a_slice("n", 2, generation=2, mig=3)})
    assert [d.name for d in got["n"]] == ["gpu-0", "gpu-1"]
    gpu = gpu_of(got["n"][1], 1)
    assert (gpu.id, gpu.index, gpu.model, gpu.memory) == ("GPU-n-1", 1, "H100-80GB", 80 * 1024 ** 3)
    assert kind_of(DEVICES["h1"]) == kind_of(DEVICES["h2"]) != kind_of(DEVICES["small"])


def test_a_node_with_slice_gpus_only_is_in_the_pool_labelled_with_its_kind() -> None:
    node = {"metadata": {"name": "h1", "labels": {}}, "spec": {},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
    assert read_node(node) is None
    dra = DraNode(tuple(gpu_of(d, i) for i, d in enumerate(DEVICES["h1"])), kind_of(DEVICES["h1"]))
    pn = read_node(node, dra)
    assert pn is not None and not pn.problem and len(pn.gpus) == 8
    assert dict(pn.labels)[DRA_NODE_LABEL] == kind_of(DEVICES["h1"])


def test_selectors_over_attributes_and_quantities() -> None:
    h100, a100 = DEVICES["h1"][0], DEVICES["small"][0]
    big = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("60Gi")) >= 0'
    assert matches(big, h100) and not matches(big, a100)
    assert matches('device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA A100")', a100)
    assert not matches('device.attributes["other.example.com"].x == 1', h100)  # an evaluation error: no
    with pytest.raises(SelectorError, match="does not compile"):
        compile_selector("device.attributes[")
    with pytest.raises(SelectorError, match=r"calls semver\(\)"):
        compile_selector('device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("1.0.0"))')


def test_counts_add_up_and_selectors_choose_the_kinds_of_nodes() -> None:
    claims = {"one": claim("one", exactly("a", 2), exactly("b", 1)),
              "big": claim("big", exactly("gpu", 1, 'device.capacity["gpu.nvidia.com"].memory.isGreaterThan('
                                                    'quantity("60Gi"))'))}
    ask = read_ask(pod("one", "big"), claims, {"gpu.nvidia.com": CLASS}, CHECK)
    assert ask is not None and ask.gpus == 4 and ask.claims == ("one", "big")
    assert ask.kinds == (kind_of(DEVICES["h1"]),)  # the 40 GiB A100s fail the memory selector
    assert with_affinity({"node_affinity": {"required": [[{"key": "k", "operator": "Exists"}]]}},
                         ask.node_affinity())["node_affinity"]["required"] == [
        [{"key": "k", "operator": "Exists"}, {"key": DRA_NODE_LABEL, "operator": "In", "values": list(ask.kinds)}]]
    devices = list(DEVICES["h1"][:4])
    assert results_for(ask, devices) == {
        "one": [{"request": "a", "driver": "gpu.nvidia.com", "pool": "h1", "device": "gpu-0"},
                {"request": "a", "driver": "gpu.nvidia.com", "pool": "h1", "device": "gpu-1"},
                {"request": "b", "driver": "gpu.nvidia.com", "pool": "h1", "device": "gpu-2"}],
        "big": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "h1", "device": "gpu-3"}]}


def test_all_takes_every_device_of_the_largest_accepted_nodes() -> None:
    ask = read_ask(pod("all"), {"all": claim("all", exactly("gpu", None))}, {"gpu.nvidia.com": CLASS}, CHECK)
    assert ask is not None and ask.gpus == 8 and ask.kinds == (kind_of(DEVICES["h1"]),)
    a100 = 'device.attributes["gpu.nvidia.com"].productName.contains("A100")'
    ask = read_ask(pod("all"), {"all": claim("all", exactly("gpu", None, a100))}, {"gpu.nvidia.com": CLASS}, CHECK)
    assert ask is not None and ask.gpus == 2 and ask.kinds == (kind_of(DEVICES["small"]),)


def test_a_template_claim_not_made_yet_is_a_wait() -> None:
    p = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
         "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}, "status": {}}
    assert read_ask(p, {}, {"gpu.nvidia.com": CLASS}, CHECK) is None
    p["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]}
    # named in the pod's status before the claims' watch brought it: not yet, no complaint (it is read again)
    assert read_ask(p, {}, {"gpu.nvidia.com": CLASS}, CHECK) is None
    ask = read_ask(p, {"p-gpu-x": claim("p-gpu-x", exactly())}, {"gpu.nvidia.com": CLASS}, CHECK)
    assert ask is not None and ask.claims == ("p-gpu-x",)


@pytest.mark.parametrize(("the_claim", "classes", "says"), [
    (claim("c", exactly(cls="example.com-fpga")), {"gpu.nvidia.com": CLASS}, "device class 'example.com-fpga'"),
    (claim("c", exactly()), {}, "DeviceClass 'gpu.nvidia.com' does not exist"),
    (claim("c", {"name": "gpu", "firstAvailable": [{"name": "x", "deviceClassName": "gpu.nvidia.com"}]}),
     {"gpu.nvidia.com": CLASS}, "firstAvailable"),
    (claim("c", exactly(), constraints=[{"matchAttribute": "gpu.nvidia.com/productName"}]),
     {"gpu.nvidia.com": CLASS}, "constraints"),
    (claim("c", {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": True}}),
     {"gpu.nvidia.com": CLASS}, "adminAccess"),
    (claim("c", exactly("a", None), exactly("b", 1)), {"gpu.nvidia.com": CLASS}, "All request beside others"),
    (claim("c", exactly("gpu", 9)), {"gpu.nvidia.com": CLASS}, "no node has enough GPU devices"),
    (claim("c", exactly(), reserved=[{"resource": "pods", "name": "other", "uid": "u2"}]),
     {"gpu.nvidia.com": CLASS}, "reserved for pods/other"),
])
def test_what_gpupool_cannot_place_is_said(the_claim: dict[str, Any], classes: dict[str, Any], says: str) -> None:
    with pytest.raises(ClaimProblem, match=says):
        read_ask(pod("c"), {"c": the_claim}, classes, CHECK)
    with pytest.raises(ClaimProblem, match="ResourceClaim ns/gone does not exist"):
        read_ask(pod("gone"), {}, {"gpu.nvidia.com": CLASS}, CHECK)


def test_the_claims_config_goes_into_the_allocation_class_first() -> None:
    cls = {**CLASS, "spec": {**CLASS["spec"], "config": [{"opaque": {"driver": "gpu.nvidia.com",
                                                                      "parameters": {"a": 1}}}]}}
    c = claim("c", exactly(), config=[{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com",
                                                                        "parameters": {"b": 2}}}])
    ask = read_ask(pod("c"), {"c": c}, {"gpu.nvidia.com": cls}, CHECK)
    assert ask is not None
    assert dict(ask.configs)["c"] == (
        {"source": "FromClass", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"a": 1}}},
        {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"b": 2}}})


def test_a_device_is_hashable_for_the_selector_memo() -> None:
    d = Device("n", "gpu.nvidia.com", "n", "gpu-0", (("gpu.nvidia.com", "index", 0),), ())
    assert hash(d) == hash(Device("n", "gpu.nvidia.com", "n", "gpu-0", (("gpu.nvidia.com", "index", 0),), ()))


def test_a_selector_that_passes_only_some_devices_of_a_kind_makes_no_node_of_it_eligible() -> None:
    for selector in ('device.attributes["gpu.nvidia.com"].index < 4',  # half of each H100 node's devices
                     'device.attributes["gpu.nvidia.com"].uuid.startsWith("GPU-h1-")'):  # one node of the kind
        c = claim("c", exactly("gpu", 1, selector))
        with pytest.raises(ClaimProblem, match="no node has enough GPU devices that all pass"):
            read_ask(pod("c"), {"c": c}, {"gpu.nvidia.com": CLASS}, kind_check({k: DEVICES[k] for k in ("h1", "h2")}))


def test_the_slice_view_follows_each_event_for_its_node_only_and_a_relist_replaces_it() -> None:
    from kubernetes import client

    from gpupool.backends.kubernetes.dra_slices import DraSlices
    from gpupool.backends.kubernetes.health import Health

    told: list[set[str]] = []
    view = DraSlices(client.ApiClient(), Health(), told.append)  # (its watch is never started here)
    view._on_reset([a_slice("a", 2), a_slice("b", 2)])
    assert told == [{"a", "b"}] and view.gpu_id("gpu.nvidia.com", "b", "gpu-1") == "GPU-b-1"
    view._on_event("ADDED", a_slice("a", 4, generation=2))  # the driver republishes node a: the newest counts
    assert told[-1] == {"a"} and [d.name for d in view.devices_of("a")] == [f"gpu-{i}" for i in range(4)]
    view._on_event("MODIFIED", a_slice("b", 2))  # nothing changed for the pool: nobody told
    assert len(told) == 2
    view._on_event("DELETED", a_slice("b", 2))
    assert told[-1] == {"b"} and view.node("b") is None and view.device_of("GPU-b-0") is None
    node_a = view.node("a")
    assert node_a is not None and [g.id for g in node_a.gpus] == [f"GPU-a-{i}" for i in range(4)]
    view._on_reset([a_slice("c", 1)])
    assert told[-1] == {"a", "c"} and set(view.devices()) == {"c"} and view.device_of("GPU-a-0") is None


def test_a_job_whose_template_claims_gpus_is_refused_where_no_claim_templates_are_read() -> None:
    from gpupool.backends.kubernetes.batch_adoption import read_job, read_jobset

    template = {"spec": {"schedulerName": "gpupool", "resourceClaims": [{"name": "gpu",
                                                                         "resourceClaimTemplateName": "one"}],
                         "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}]}}
    job = {"metadata": {"name": "j", "namespace": "ns", "uid": "u", "labels": {"gpupool.io/project": "vision"}},
           "spec": {"parallelism": 2, "template": template}}
    _spec, _user, problem = read_job(job, "gpupool")
    assert "claims devices through DRA" in problem and "reads no ResourceClaimTemplates" in problem
    js = {"metadata": {"name": "s", "namespace": "ns", "uid": "v", "labels": {"gpupool.io/project": "vision"}},
          "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {"template": template}}}]}}
    assert "(replicated job w): its pod template claims devices through DRA" in read_jobset(js, "gpupool")[2]


def test_an_api_server_without_resource_k8s_io_v1_turns_dra_off_instead_of_a_failing_watch() -> None:
    import http.server
    import threading

    from kubernetes import client

    from gpupool.backends.kubernetes.dra_slices import DraSlices
    from gpupool.backends.kubernetes.dra_watch import DraClaims
    from gpupool.backends.kubernetes.health import Health

    class Old(http.server.BaseHTTPRequestHandler):  # an API server of before 1.34: no resource.k8s.io/v1
        def do_GET(self) -> None:  # noqa: N802 (the http.server name)
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"kind":"Status","code":404}')

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Old)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        conf = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
        health = Health()
        view = DraSlices(client.ApiClient(conf), health, lambda nodes: None)
        view.start()
        claims = DraClaims(client.ApiClient(conf), health, lambda claim: None)
        claims.start(view.served)
        assert not view.served and view.watch.synced.is_set() and claims.synced
        assert health.snapshot()["ok"] is True and not view.devices()
        view.close()
        claims.close()
    finally:
        server.shutdown()
