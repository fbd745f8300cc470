"""A real ``jupyter server`` process with the extension stops on one SIGTERM, refused GPU kernels or not.

In-process server fixtures cannot show this: the hang was in the server's own
stop sequence (``ServerApp._stop`` -> ``cleanup_kernels``), so the test runs
the server as a user does and signals it once.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient

from tests.jupyter.server_process import api, start_server

pytestmark = pytest.mark.timeout(180)

def test_server_with_a_refused_gpu_kernel_stops_on_one_sigterm(tmp_path: Path) -> None:
    server = start_server(tmp_path, {"simulate": "4xA100-80GB", "build_quota": 1.0, "lease_seconds": 60.0,
                                     "scheduler_config": {"tick_s": 0.3}})
    proc, port, log = server.proc, server.port, server.log
    try:
        status, kernel = api(port, "/api/kernels", "POST", {"name": "gpupool-python3-0.25"})
        assert status == 201, kernel
        # as in Lab: the GPU kernel is up and answering when the user asks for more
        client = BlockingKernelClient(connection_file=str(server.runtime / f"kernel-{kernel['id']}.json"))
        client.load_connection_file()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
        finally:
            client.stop_channels()
        status, refused = api(port, "/api/kernels", "POST", {"name": "gpupool-python3-1"})
        assert status == 409 and "build quota" in refused["message"]
        status, kernels = api(port, "/api/kernels")
        assert [k["id"] for k in kernels] == [kernel["id"]]

        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)  # a kernel shutdown takes a second or two; a hang never ends
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server did not stop on SIGTERM:\n{log.read_text()}")
        text = log.read_text()
        assert "Kernel does not exist" not in text, text
        assert "Shutting down 1 kernel" in text
    finally:
        server.kill()  # the server and the kernels it started
