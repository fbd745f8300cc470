"""A pod refused by a validating admission webhook (an admin's policy engine), served by the test over HTTPS.

The ResourceQuota case is in test_refused_pods.py; this one is the other kind of refusal issue 24 names: the
API server calls a webhook it was told about (a ValidatingWebhookConfiguration, scoped to the test's namespace)
and relays its "denied" as the create's answer. What a user must see is the same: the job never shows
"running" without a pod, its GPUs go back at once, the webhook's words are its reason, it waits with a backoff
and fails after ``kube_refusals_before_failure`` refusals; a gang binds none of its pods when one is refused;
once the policy allows, the requeued job starts. A webhook that does not answer (``failurePolicy: Fail``, the
API server's 500 "failed calling webhook") is a refusal as well, not an outage to retry while "running".
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import json
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from gpupool.backends.kubernetes.calls import refusal
from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)
HOOK = "gpu-policy.gpupool.test"
MESSAGE = "policy: GPU pods need the label team"
PROBE = "admission-probe"  # dry-run pods the fixture creates to see the webhook in force; always denied

Rule = Callable[[dict[str, Any]], str | None]
"""A policy: the message to deny a Pod (its JSON, as the API server sends it) with, or None to admit it."""


def make_certs(folder: Path) -> tuple[bytes, Path, Path]:
    """A throwaway CA and a server certificate it signs for 127.0.0.1 / localhost: (CA PEM, cert, key).

    The API server (Go) checks the webhook's certificate against the configuration's ``caBundle`` and
    the URL's host against the SAN only (no Common Name fallback), hence the IP SAN. Made with the
    ``cryptography`` package (jupyterhub, a test dependency, brings it), else with the ``openssl``
    binary (which ../shared/kube needs for its own certificates).
    """
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return _openssl_certs(folder)
    return _cryptography_certs(folder)


def _cryptography_certs(folder: Path) -> tuple[bytes, Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpupool test webhook CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_file, key_file = folder / "webhook.crt", folder / "webhook.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return ca.public_bytes(serialization.Encoding.PEM), cert_file, key_file


_OPENSSL_CONFIG = """[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical,CA:TRUE,pathlen:0
keyUsage = critical,keyCertSign,cRLSign
[server]
basicConstraints = critical,CA:FALSE
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
"""


def _openssl_certs(folder: Path) -> tuple[bytes, Path, Path]:
    config = folder / "openssl.cnf"
    config.write_text(_OPENSSL_CONFIG)
    ec_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca_cert, ca_key = folder / "ca.crt", folder / "ca.key"
    cert_file, key_file, csr = folder / "webhook.crt", folder / "webhook.key", folder / "webhook.csr"
    for argv in (
        ["req", "-x509", "-config", config, "-extensions", "ca", *ec_key, "-keyout", ca_key, "-out", ca_cert,
         "-days", "1", "-subj", "/CN=gpupool test webhook CA"],
        ["req", "-new", "-config", config, *ec_key, "-keyout", key_file, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-set_serial", str(int(time.time())),
         "-out", cert_file, "-days", "1", "-extfile", config, "-extensions", "server"],
    ):
        subprocess.run(["openssl", *map(str, argv)], check=True, capture_output=True)
    return ca_cert.read_bytes(), cert_file, key_file


class PolicyWebhook:
    """A validating admission webhook on loopback (HTTPS, a thread): answers AdmissionReview v1 with ``rule``.

    ``rule`` may be replaced at any time (the admin changes the policy). ``code`` is the HTTP code of a
    denial's Status (None: unset, which the API server turns into 400). Every review of a real (not
    dry-run) Pod create is kept in ``reviews`` as (monotonic time, pod name, denied).
    """

    def __init__(self, folder: Path, rule: Rule, code: int | None = None) -> None:
        self.rule = rule
        self.code = code
        self.down = False
        """While True, every call is answered 503 (no review): with ``failurePolicy: Fail`` the API server
        then refuses every pod the webhook covers."""
        self.reviews: list[tuple[float, str, bool]] = []
        self._lock = threading.Lock()
        ca_pem, cert_file, key_file = make_certs(folder)
        self.ca_bundle = base64.b64encode(ca_pem).decode()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                if hook.down:  # the policy engine is unwell: no AdmissionReview comes back
                    self.send_error(503, "policy engine restarting")
                    return
                review = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                body = json.dumps(hook.answer(review)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # quiet: pytest shows the assertions
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self._server.server_address[1]}/validate"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="test-webhook")
        self._thread.start()

    def answer(self, review: dict[str, Any]) -> dict[str, Any]:
        """The AdmissionReview response to ``review``: allowed, or denied with the rule's message."""
        request = review.get("request") or {}
        pod = request.get("object") or {}
        name = str((pod.get("metadata") or {}).get("name") or "")
        denied = PROBE if name.startswith(PROBE) else self.rule(pod)
        if not request.get("dryRun"):
            with self._lock:
                self.reviews.append((time.monotonic(), name, denied is not None))
        response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": denied is None}
        if denied is not None:
            response["status"] = {"message": denied, **({"code": self.code} if self.code else {})}
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    def seen(self, name: str) -> list[tuple[float, bool]]:
        """The reviews of creates of pod ``name``: (monotonic time, denied)."""
        with self._lock:
            return [(t, d) for t, n, d in self.reviews if n == name]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@pytest.fixture
def webhook(api: Any, namespace: str, tmp_path: Path) -> Iterator[PolicyWebhook]:
    """A :class:`PolicyWebhook` (denying nothing until the test sets its rule) in force for the test's
    namespace only; its ValidatingWebhookConfiguration is deleted afterwards, pass or fail."""
    label = "gpupool-test/admission"  # v1.20 does not label namespaces with their name: the test does
    api.patch_namespace(namespace, {"metadata": {"labels": {label: namespace}}})
    hook = PolicyWebhook(tmp_path, lambda pod: None)
    admission = client.AdmissionregistrationV1Api(api.api_client)
    config_name = f"gpu-policy-{namespace}"
    admission.create_validating_webhook_configuration({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": config_name},
        "webhooks": [{
            "name": HOOK,
            "clientConfig": {"url": hook.url, "caBundle": hook.ca_bundle},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                       "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {label: namespace}},
            "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        }],
    })
    try:
        _wait_in_force(api, namespace)
        yield hook
    finally:
        try:
            admission.delete_validating_webhook_configuration(config_name)
        finally:
            hook.close()


def _wait_in_force(api: Any, namespace: str, timeout: float = 30.0) -> None:
    """Until a dry-run Pod create in the namespace is denied by the webhook: the API server learns of a new
    webhook configuration (and of the namespace's label) through its informers, a moment after the write."""
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{PROBE}-1"},
             "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}
    deadline = time.monotonic() + timeout
    while True:
        try:
            api.create_namespaced_pod(namespace, probe, dry_run="All")
        except ApiException as e:
            if "denied the request" in str(e.body):
                return
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError("the admission webhook never came into force")
        time.sleep(0.1)


def allocations(core: Any) -> list[Any]:
    return [a for n in core.pool()["nodes"] for g in n["gpus"] for a in g["allocations"]]


def job_pods(api: Any, namespace: str, job_id: str) -> list[Any]:
    return [p for p in api.list_namespaced_pod(namespace).items if p.metadata.labels.get("gpupool.io/job") == job_id]


def project_rule(project: str) -> Rule:
    """The admin's policy: pods of ``project`` need the label ``team`` (gpupool's carry none)."""
    def rule(pod: dict[str, Any]) -> str | None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return MESSAGE if labels.get("gpupool.io/project") == project and "team" not in labels else None
    return rule


async def test_a_pod_the_webhook_denies_frees_its_gpus_waits_with_backoff_and_fails_with_its_message(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any, webhook: PolicyWebhook) -> None:
    webhook.rule = project_rule("vision")
    gpu_nodes(1, gpus=8)
    core = await make_core(kube_refused_backoff_s=1.0, kube_refusals_before_failure=3)
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 4})
    core.set_project(ADMIN, "nlp", {"train_guarantee": 4})
    with Kubelet(api, namespace) as kubelet:
        big, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 8, "command": ["python", "train.py"]})
        name = f"gpupool-{big['id'].lower()}-1"
        states: list[tuple[float, str]] = []  # the big job's state, sampled; the webhook lets none of its pods be
        reasons: set[str] = set()

        async def sample() -> None:
            while True:
                j = core.get_job(ADMIN, big["id"])
                states.append((time.monotonic(), j["state"]))
                reasons.add(j["reason"].rpartition("; ")[2])
                await asyncio.sleep(0.02)

        sampler = asyncio.create_task(sample())
        try:
            held = await wait_for(lambda: MESSAGE in (j := core.get_job(ADMIN, big["id"]))["reason"] and j,
                                  what="the webhook's denial as the job's reason")
            refused = (f'the API server refused pod {name}: admission webhook "{HOOK}" denied the request: '
                       f"{MESSAGE} (Bad Request)")
            assert held["state"] == "queued" and held["attempts"] == 0, held
            assert held["reason"] == f"{refused}; refusal 1 of 3, tried again in 1 s", held["reason"]
            assert allocations(core) == []  # its 8 GPUs went back with the refusal
            # Another project's job, which the policy admits, starts on those GPUs while the big one waits.
            small, _ = await core.submit(ADMIN, {"project": "nlp", "gpus": 1, "command": ["python", "eval.py"]})
            await wait_for(lambda: core.get_job(ADMIN, small["id"])["state"] == "running", what="the small job")
            pod = await wait_for(lambda: [p for p in job_pods(api, namespace, small["id"]) if p.spec.node_name],
                                 what="the small job's pod bound")
            kubelet.finish(pod[0].metadata.name, 0)  # it ends: the big job fits again and is tried again
            await wait_for(lambda: core.get_job(ADMIN, small["id"])["state"] == "succeeded", what="the small job")
            failed = await wait_for(lambda: (j := core.get_job(ADMIN, big["id"]))["state"] not in ("queued",
                                                                                                   "running") and j,
                                    what="the big job failed")
            await asyncio.sleep(1.0)  # and it is not tried again after that
        finally:
            sampler.cancel()
    assert failed["state"] == "failed", failed
    assert failed["reason"] == (f"{refused} (refused 3 times in a row; failed after "
                                "kube_refusals_before_failure)"), failed["reason"]
    assert failed["attempts"] == 0  # no attempt ever ran
    assert {"refusal 1 of 3, tried again in 1 s", "refusal 2 of 3, tried again in 2 s"} <= reasons, reasons
    # The webhook was asked three times, each after the job's backoff (1 s, then 2 s), never in between.
    tries = webhook.seen(name)
    assert [d for _t, d in tries] == [True, True, True], tries
    gaps = [b[0] - a[0] for a, b in zip(tries, tries[1:], strict=False)]
    assert gaps[0] >= 0.95 and gaps[1] >= 1.95, gaps
    # "running" only for the instant between the cycle's decision and the refusal: never for long.
    longest = stretch = 0.0
    for (t0, s0), (t1, _s1) in zip(states, states[1:], strict=False):
        stretch = stretch + (t1 - t0) if s0 == "running" else 0.0
        longest = max(longest, stretch)
    assert longest < 1.0, f"the refused job showed 'running' for {longest:.2f} s with no pod"
    assert job_pods(api, namespace, big["id"]) == []
    assert allocations(core) == []


async def test_a_gang_the_webhook_refuses_binds_none_of_its_pods_and_starts_once_the_policy_allows(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any, webhook: PolicyWebhook) -> None:
    # A policy that admits rank 0's pod and denies rank 1's: the gang's first pod exists when the second is
    # refused, so "create all, then bind" must delete it unbound.
    webhook.code = 403
    webhook.rule = lambda pod: MESSAGE if str(pod["metadata"]["name"]).endswith("-r1") else None
    gpu_nodes(2, gpus=8)
    core = await make_core(kube_refused_backoff_s=1.0)
    await wait_for(lambda: len(core.pool()["nodes"]) == 2, what="both nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 16})
    seen: list[tuple[str, bool]] = []  # every version of every pod the watch saw: (name, bound)
    stop = threading.Event()

    def watch_pods() -> None:
        w = watch.Watch()
        while not stop.is_set():
            for ev in w.stream(api.list_namespaced_pod, namespace, timeout_seconds=1):
                pod = ev["object"]
                seen.append((pod.metadata.name, bool(pod.spec.node_name)))

    watcher = threading.Thread(target=watch_pods, daemon=True)
    watcher.start()
    try:
        with Kubelet(api, namespace):
            gang, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 8, "replicas": 2,
                                                "command": ["torchrun", "train.py"]})
            r0, r1 = (f"gpupool-{gang['id'].lower()}-1-r{k}" for k in (0, 1))
            held = await wait_for(lambda: MESSAGE in (j := core.get_job(ADMIN, gang["id"]))["reason"] and j,
                                  what="the webhook's denial as the gang's reason")
            assert held["state"] == "queued" and held["attempts"] == 0, held
            assert held["reason"] == (f'the API server refused pod {r1}: admission webhook "{HOOK}" denied the '
                                      f"request: {MESSAGE} (Forbidden); refusal 1 of 5, tried again in 1 s"), held
            assert allocations(core) == []  # both replicas' GPUs went back
            await wait_for(lambda: job_pods(api, namespace, gang["id"]) == [], what="rank 0's pod deleted")
            await wait_for(lambda: (r0, False) in seen, what="the watch saw rank 0's pod")  # created, then deleted
            assert [n for n, bound in seen if bound] == [] and r1 not in {n for n, _b in seen}, seen
            assert [d for _t, d in webhook.seen(r0)] == [False] and [d for _t, d in webhook.seen(r1)] == [True]
            # The admin lets the gang's pods in: after its backoff it is tried again, and both replicas run.
            webhook.rule = lambda pod: None
            await wait_for(lambda: core.get_job(ADMIN, gang["id"])["state"] == "running", what="the gang running")
            pods = await wait_for(lambda: len(ps := [p for p in job_pods(api, namespace, gang["id"])
                                                     if p.status.phase == "Running"]) == 2 and ps,
                                  what="both replicas' pods running")
    finally:
        stop.set()
        watcher.join(5)
    assert sorted(p.metadata.name for p in pods) == [r0, r1]
    assert len({p.spec.node_name for p in pods}) == 2  # one replica per node
    assert len(allocations(core)) == 16
    assert [d for _t, d in webhook.seen(r1)] == [True, False]  # denied once, admitted on the retry



def test_a_webhook_call_that_fails_is_a_refusal_and_any_other_500_is_not() -> None:
    def answer(status: int, body: str) -> ApiException:
        e = ApiException(status=status, reason="Internal Server Error")
        e.body = body
        return e

    failed = ('{"kind":"Status","message":"Internal error occurred: failed calling webhook \\"p.example\\": '
              'Post \\"https://p/validate\\": dial tcp: connect: connection refused","reason":"InternalError",'
              '"code":500}')
    assert refusal(answer(500, failed)) == ('Internal error occurred: failed calling webhook "p.example": Post '
                                            '"https://p/validate": dial tcp: connect: connection refused '
                                            "(InternalError)")
    assert refusal(answer(500, '{"message":"etcdserver: request timed out","reason":"InternalError"}')) is None


async def test_a_webhook_that_does_not_answer_holds_the_job_queued_not_running_until_it_is_back(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any, webhook: PolicyWebhook) -> None:
    # failurePolicy: Fail and the policy engine away: the API server answers every create of the namespace's
    # pods with a 500 "failed calling webhook". That is the webhook's refusal, not an API server outage: the
    # job must not show "running" holding its GPUs while the create is retried.
    webhook.down = True
    gpu_nodes(1, gpus=8)
    core = await make_core(kube_refused_backoff_s=1.0)
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    with Kubelet(api, namespace):
        job, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 8, "command": ["python", "train.py"]})
        name = f"gpupool-{job['id'].lower()}-1"
        held = await wait_for(lambda: "failed calling webhook" in (j := core.get_job(ADMIN, job["id"]))["reason"]
                              and j, timeout=10.0, what="the webhook's failure as the job's reason")
        assert held["state"] == "queued" and held["attempts"] == 0, held
        assert held["reason"].startswith(f'the API server refused pod {name}: Internal error occurred: failed '
                                         f'calling webhook "{HOOK}"'), held["reason"]
        assert held["reason"].endswith("(InternalError); refusal 1 of 5, tried again in 1 s"), held["reason"]
        assert allocations(core) == []
        webhook.down = False  # the policy engine is back, and admits the pod
        await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "running", what="the job running")
        pod = await wait_for(lambda: [p for p in job_pods(api, namespace, job["id"]) if p.status.phase == "Running"],
                             what="its pod running")
    assert pod[0].metadata.name == name
    assert len(allocations(core)) == 8
