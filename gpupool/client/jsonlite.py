"""JSON for the CLI's hot path: the standard library's own C codec, without importing ``json``.

Why: ``import json`` imports ``re`` (and through it ``enum``) for two regular
expressions, a few milliseconds of every `gpupool` call; scripted submission
pays them per job. The codec itself is CPython's ``_json`` module, the one
``json`` uses: the same encoding (ASCII, ``,``/``:`` separators) and the same
parser (strict, NaN/Infinity accepted as ``json`` does). Where ``_json`` is
missing (another Python), this falls back to ``json``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
except ImportError:  # pragma: no cover - CPython always has it
    _json = None  # type: ignore[assignment]

_WHITESPACE = " \t\n\r"


def _unserialisable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _constant(name: str) -> float:
    return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]


class _Context:
    """What ``_json.make_scanner`` reads off the decoder it scans for (plain objects, lists, numbers)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_constant)
    memo: dict[str, str] = {}


if _json is not None:
    _encode = _json.make_encoder({}, _unserialisable, _json.encode_basestring_ascii, None, ": ", ", ",
                                 False, False, True)
    _scan = _json.make_scanner(_Context())

    def dumps(value: Any) -> str:
        """``json.dumps(value)``, same text."""
        return "".join(_encode(value, 0))

    def loads(text: str | bytes) -> Any:
        """``json.loads(text)``; raises ``ValueError`` for anything that is not one JSON value."""
        if isinstance(text, bytes | bytearray):
            text = bytes(text).decode("utf-8")
        start = len(text) - len(text.lstrip(_WHITESPACE))
        try:
            value, end = _scan(text, start)
        except StopIteration:
            raise ValueError(f"not JSON: expecting a value at character {start}") from None
        rest = text[end:].strip(_WHITESPACE)
        if rest:
            raise ValueError(f"not JSON: extra data at character {end}")
        return value
else:  # pragma: no cover
    import json as _stdlib_json

    dumps = _stdlib_json.dumps
    loads = _stdlib_json.loads
