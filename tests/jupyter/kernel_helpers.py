"""Helpers to run code inside kernels the test server started."""

from __future__ import annotations

import json
from typing import Any

ENV_PROBE = "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(('GPUPOOL', 'CUDA', 'JPY'))}))"


async def run_in_kernel(serverapp: Any, kernel_id: str, code: str, timeout: float = 60) -> str:
    """Execute ``code`` in a running kernel and return its stdout."""
    km = serverapp.kernel_manager.get_kernel(kernel_id)
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=timeout)
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("ERROR: " + "\n".join(msg["content"]["traceback"]))

        reply = await kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        assert reply["content"]["status"] == "ok", "".join(out)
        return "".join(out)
    finally:
        kc.stop_channels()


async def kernel_env(serverapp: Any, kernel_id: str) -> dict[str, str]:
    """The GPUPOOL_*, CUDA_* and JPY_* environment inside a kernel."""
    return json.loads(await run_in_kernel(serverapp, kernel_id, ENV_PROBE))
