"""What a request asks of a GPU, in the terms the placement measures count it.

Both fragmentation-aware measures (:mod:`gpupool.policy.placement_frag`,
:mod:`gpupool.policy.placement_capacity`) group requests by GPU *shape* (whole
GPUs, a fraction, GPU memory; with the models allowed) and by *type* (shape and
CPU need): the learned request mix is a count per type, and their tables hold one
column per shape. Keeping the naming of shapes and the per-node tables they
derive in one place is what makes the two measures agree on them. A request
is checked here too (:func:`check_request`): a shape has exactly one GPU form.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpupool.policy.model import Request
from gpupool.wire.errors import InvalidRequest

if TYPE_CHECKING:
    from gpupool.policy.placement import FreeState

Shape = tuple
"""("w", n, models) whole GPUs, ("f", milli, models) a fraction, ("m", mib, models) GPU memory."""


def check_request(request: Request) -> None:
    """Refuse a request that sets more than one GPU form or a nonsense amount (every shape has one form)."""
    forms = (request.gpus > 0) + (request.gpu_milli > 0) + (request.gpu_memory_mib > 0)
    if forms > 1:
        raise InvalidRequest("a request asks for whole GPUs, a GPU fraction or GPU memory, not several")
    if request.gpus < 0 or request.gpu_milli < 0 or request.gpu_memory_mib < 0:
        raise InvalidRequest("GPU amounts in a request cannot be negative")
    if request.gpu_milli > 1000:
        raise InvalidRequest(f"a GPU fraction is at most one GPU (got {request.gpu_milli} milli)")
    if request.cpu_milli < 0 or request.memory_mib < 0:
        raise InvalidRequest("CPU and memory in a request cannot be negative")


def request_shape(request: Request) -> Shape | None:
    """The GPU shape of a request; None for CPU-only work (it fragments no GPU)."""
    models = tuple(sorted(request.gpu_models)) if request.gpu_models else ()
    if request.gpus:
        return ("w", request.gpus, models)
    if request.gpu_milli:
        return ("f", request.gpu_milli, models)
    if request.gpu_memory_mib:
        return ("m", request.gpu_memory_mib, models)
    return None


def request_type(request: Request) -> tuple[Shape, int] | None:
    """The request type the mix counts: (GPU shape, CPU need); None for CPU-only work."""
    shape = request_shape(request)
    return None if shape is None else (shape, request.cpu_milli)


def shape_volume(shape: Shape) -> float:
    """Milli-GPU a request of this shape takes (memory shapes: counted as half a GPU)."""
    kind, amount, _ = shape
    return 1000.0 * amount if kind == "w" else float(amount) if kind == "f" else 500.0


def shape_tables(
    st: FreeState, shapes: list[Shape], whole_demand: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(demand, allowed, GPU capacity per node) for ``shapes`` on the nodes of ``st``.

    ``demand[node, s]``: share one request of shape s takes on a GPU of the
    node (whole GPUs: ``whole_demand``, or the node's GPU capacity when None);
    ``allowed[node, s]``: the shape's models allow the node (and it has GPUs).
    """
    n = len(st.names)
    node_model = st.model_id[:, 0] if n else np.zeros(0, dtype=np.int64)
    gpu_mem = st.gpu_mem[:, 0] if n else np.zeros(0, dtype=np.int64)  # at least 1 (see placement_layout.Layout)
    cap = st.cap.max(axis=1) if n else np.zeros(0, dtype=np.int64)
    demand = np.zeros((n, len(shapes)), dtype=np.int64)
    allowed = np.ones((n, len(shapes)), dtype=bool)
    for k, (kind, amount, models) in enumerate(shapes):
        if kind == "w":
            demand[:, k] = cap if whole_demand is None else whole_demand
        elif kind == "f":
            demand[:, k] = amount
        else:
            demand[:, k] = -(-amount * 1000 // gpu_mem)
        if models:
            ids = [st.models[m] for m in models if m in st.models]
            allowed[:, k] = np.isin(node_model, ids)
    allowed &= st.valid[:, :1]
    return demand, allowed, cap
