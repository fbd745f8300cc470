"""Cap PyTorch's GPU memory to the share the scheduler granted.

The scheduler puts this directory first on ``PYTHONPATH`` of the processes it
starts (gpupool.envbuilder), so Python imports this module at start-up. It
does two things and nothing else:

1. runs any other ``sitecustomize`` further down ``sys.path`` (a site's own
   customisation must keep working), and
2. when ``GPUPOOL_GPU_FRACTION`` is below 1, watches for ``import torch`` and
   then calls ``torch.cuda.set_per_process_memory_fraction(fraction, i)`` for
   every visible device. The call is queued with ``torch.cuda._lazy_call`` when
   torch has it, so CUDA is not initialised merely by importing torch (that
   would break fork-based data loaders); otherwise it runs at once if CUDA is
   available.

It must never break the interpreter: every failure is swallowed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain_other_sitecustomize() -> None:
    others = [p for p in sys.path if p and os.path.abspath(p) != _HERE]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["_gpupool_chained_sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as e:  # a broken site hook must not stop the job
        print(f"gpupool: the chained sitecustomize failed: {e}", file=sys.stderr)


def _fraction() -> float:
    try:
        return float(os.environ.get("GPUPOOL_GPU_FRACTION", "1"))
    except ValueError:
        return 1.0


def _apply_limit(torch: object, fraction: float) -> None:
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return

    def set_limits() -> None:
        try:
            if not cuda.is_available():
                return
            for i in range(cuda.device_count()):
                cuda.set_per_process_memory_fraction(fraction, i)
        except Exception as e:
            print(f"gpupool: could not cap torch GPU memory: {e}", file=sys.stderr)

    lazy = getattr(cuda, "_lazy_call", None)
    initialized = getattr(cuda, "is_initialized", lambda: False)
    try:
        if lazy is not None and not initialized():
            lazy(set_limits)
        else:
            set_limits()
    except Exception as e:
        print(f"gpupool: could not cap torch GPU memory: {e}", file=sys.stderr)


class _AfterLoader(importlib.abc.Loader):
    """Wraps torch's real loader and applies the cap right after torch's module body ran."""

    def __init__(self, inner: importlib.abc.Loader, fraction: float) -> None:
        self._inner = inner
        self._fraction = fraction

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        self._inner.exec_module(module)
        _apply_limit(module, self._fraction)


class _TorchWatcher(importlib.abc.MetaPathFinder):
    def __init__(self, fraction: float) -> None:
        self._fraction = fraction
        self._busy = False

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname != "torch" or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        sys.meta_path.remove(self)  # one shot
        spec.loader = _AfterLoader(spec.loader, self._fraction)
        return spec


def _install() -> None:
    fraction = _fraction()
    if not 0 < fraction < 1:
        return
    if "torch" in sys.modules:
        _apply_limit(sys.modules["torch"], fraction)
        return
    sys.meta_path.insert(0, _TorchWatcher(fraction))


_chain_other_sitecustomize()
try:
    _install()
except Exception as e:
    print(f"gpupool: torch memory hook not installed: {e}", file=sys.stderr)
