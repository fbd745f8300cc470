"""CEL selectors of DeviceClasses and claim requests, evaluated over one device (``cel-python``).

Kubernetes writes which devices a claim may get as CEL expressions over a
``device`` variable: ``device.driver``, ``device.attributes["<domain>"].<name>``
and ``device.capacity["<domain>"].<name>`` (a quantity: ``quantity("40Gi")``,
``.compareTo()``, ``.isGreaterThan()``, ``.isLessThan()``, ``.asInteger()``).
This module compiles each expression once and memoises its result per device
(devices are immutable values), so a pod read again costs nothing. An
expression that does not compile is the claim's problem
(:class:`SelectorError`, said in the pod's event); one that fails on a device
(an attribute the device lacks) rejects that device, as Kubernetes does not
allocate a device its selector cannot evaluate to true.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, cast

import celpy
from celpy import celtypes
from kubernetes.utils import parse_quantity

from gpupool.backends.kubernetes.dra_slices import Device


class SelectorError(ValueError):
    """A CEL expression gpupool cannot compile (its message says where)."""


class Quantity(celtypes.IntType):
    """A resource quantity in CEL, as its value in base units (bytes for memory)."""


def _quantity(text: Any) -> Quantity:
    try:
        return Quantity(int(parse_quantity(str(text))))
    except (ValueError, TypeError) as e:
        raise ValueError(f"quantity({text!r}) is not a quantity") from e


def _compare(a: Any, b: Any) -> celtypes.IntType:
    return celtypes.IntType((int(a) > int(b)) - (int(a) < int(b)))


FUNCTIONS = {
    "quantity": _quantity,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celtypes.BoolType(int(a) > int(b)),
    "isLessThan": lambda a, b: celtypes.BoolType(int(a) < int(b)),
    "asInteger": lambda a: celtypes.IntType(int(a)),
    "asApproximateFloat": lambda a: celtypes.DoubleType(float(int(a))),
}
_ENV = celpy.Environment()
_MACROS = {"has", "all", "exists", "exists_one", "map", "filter"}
KNOWN = frozenset(FUNCTIONS) | frozenset(celpy.evaluation.base_functions) | _MACROS
"""Functions gpupool evaluates: CEL's own, and Kubernetes' quantity library (not its semver or IP ones)."""


@lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Any:
    """The expression's program; raises :class:`SelectorError` saying why it does not compile."""
    try:
        tree = _ENV.compile(expression)
    except Exception as e:  # cel-python's parse errors carry the caret line: keep the first line only
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SelectorError(f"CEL expression {expression!r} does not compile ({first})") from e
    for sub in tree.iter_subtrees():
        if sub.data in ("ident_arg", "member_dot_arg"):
            for token in sub.children:
                if not hasattr(token, "data") and str(token) not in KNOWN:
                    raise SelectorError(f"CEL expression {expression!r} calls {token}(), which gpupool cannot "
                                        "evaluate (it knows CEL's functions and quantity())")
    return _ENV.program(tree, functions=FUNCTIONS)  # type: ignore[arg-type]


def _activation(device: Device) -> dict[str, Any]:
    attributes: dict[str, dict[str, Any]] = {}
    for domain, name, value in device.attributes:
        attributes.setdefault(domain, {})[name] = value
    capacity: dict[str, dict[str, Any]] = {}
    for domain, name, amount in device.capacity:
        capacity.setdefault(domain, {})[name] = amount
    # json_to_cel turns a dict into a MapType (its type says only "a CEL value"), which takes the capacity key
    cel = cast(celtypes.MapType, celpy.json_to_cel({"driver": device.driver, "attributes": attributes}))
    cel[celtypes.StringType("capacity")] = celtypes.MapType({
        celtypes.StringType(d): celtypes.MapType({celtypes.StringType(n): Quantity(v) for n, v in caps.items()})
        for d, caps in capacity.items()})
    return {"device": cel}


@lru_cache(maxsize=65536)
def matches(expression: str, device: Device) -> bool:
    """Whether the device passes the (compilable) expression; an evaluation error is a no."""
    program = compile_selector(expression)
    try:
        result = program.evaluate(_activation(device))
    except Exception:
        return False
    return isinstance(result, celtypes.BoolType) and bool(result)
