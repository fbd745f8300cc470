"""Hypothesis strategies for HTTP requests, derived from our OpenAPI document.

schemathesis also runs against the document (tests/api/test_openapi_fuzz.py,
with hypothesis pinned so that hypothesis-jsonschema works), but draws only
what the schemas describe; this generator adds the shapes we know break
services: lone surrogates, deep nesting, malformed JSON, bodies that pass the
schema and reach the core. It reads the same document the service serves: for
each operation it draws path parameters, query parameters and a body that are
either valid by the schema ("positive") or broken in one place: a wrong type, an out-of-range number, an unknown field, a
missing required field, a string holding a lone surrogate (``"\\ud800"`` is valid
JSON but not storable UTF-8), a value nested deeper than the service takes,
malformed JSON ("negative").

Only the schema subset the API uses is understood: type, enum, nullable,
minimum/maximum (with OpenAPI 3.0 boolean exclusives), minLength/maxLength,
pattern (only for NUL-free strings, plain text and names), items, properties, required,
additionalProperties, propertyNames.
"""

from __future__ import annotations

import copy
import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from gpupool.wire.plain_text import PLAIN_TEXT_PATTERN
from gpupool.wire.schemas import ENV_NAME, NO_NUL

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
ANY_JSON = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
# A string with a lone surrogate somewhere: JSON can carry it (as an escape), UTF-8 cannot.
SURROGATE_TEXT = st.builds(lambda a, s, b: a + s + b, st.text(max_size=6), st.characters(categories=["Cs"]),
                           st.text(max_size=6))
# Arrays inside arrays: from just past the service's limit (64 levels) to past Python's recursion limit.
DEEP_JSON = st.sampled_from([65, 200, 999, 1500, 100_000]).map(lambda n: "[" * n + "]" * n)
WEIRD_TEXT = st.text(max_size=40) | st.sampled_from(["", " ", "..", "%00", "\x00", "a/b", "é", "😀", "-1", "1e309",
                                                     "null", "NaN", "9" * 30, "x" * 300])


@dataclass
class Operation:
    method: str
    path: str  # with {name} placeholders
    path_params: list[str] = field(default_factory=list)
    query: dict[str, dict[str, Any]] = field(default_factory=dict)
    body_schema: dict[str, Any] | None = None


def operations(doc: dict[str, Any]) -> list[Operation]:
    """Every operation of the document, with its parameters and body schema resolved."""
    schemas = doc["components"]["schemas"]
    out = []
    for path, item in doc["paths"].items():
        shared = item.get("parameters", [])
        for method, op in item.items():
            if method == "parameters":
                continue
            params = shared + op.get("parameters", [])
            body = None
            if "requestBody" in op:
                ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                body = schemas[ref.rsplit("/", 1)[1]]
            out.append(Operation(
                method.upper(), path,
                [p["name"] for p in params if p["in"] == "path"],
                {p["name"]: p["schema"] for p in params if p["in"] == "query"},
                body,
            ))
    return out


def valid(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values the schema accepts."""
    strategy = _valid_non_null(schema)
    if schema.get("nullable"):
        strategy = st.none() | strategy
    return strategy


def _valid_non_null(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        return st.floats(schema.get("minimum"), schema.get("maximum"), allow_nan=False, allow_infinity=False,
                         exclude_min=bool(schema.get("exclusiveMinimum")),
                         exclude_max=bool(schema.get("exclusiveMaximum")))
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return _string(schema)
    if kind == "array":
        return st.lists(valid(schema.get("items", {})), min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", 4), 4))
    if kind == "object":
        props = schema.get("properties")
        if props is not None:
            required = set(schema.get("required", []))
            return st.fixed_dictionaries(
                {k: valid(v) for k, v in props.items() if k in required},
                optional={k: valid(v) for k, v in props.items() if k not in required},
            )
        key_pattern = schema.get("propertyNames", {}).get("pattern")  # labels limit only the keys' length
        keys = (_string({"pattern": key_pattern}).filter(lambda s: len(s) < 40)
                if key_pattern else st.text(max_size=10))
        return st.dictionaries(keys, valid(schema.get("additionalProperties", {})), max_size=3)
    return ANY_JSON


def _string(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    pattern = schema.get("pattern")
    lo, hi = schema.get("minLength", 0), min(schema.get("maxLength", 40), 40)
    if pattern in (None, NO_NUL):
        alphabet = st.characters(exclude_characters="\x00", exclude_categories=("Cs",))
        return st.text(alphabet, min_size=lo, max_size=hi)
    if pattern == PLAIN_TEXT_PATTERN:  # text others read: no controls, separators or format characters
        alphabet = st.characters(exclude_categories=("Cs", "Cc", "Zl", "Zp", "Cf"))
        return st.text(alphabet, min_size=lo, max_size=hi)
    if pattern == ENV_NAME:
        return st.from_regex(ENV_NAME, fullmatch=True).filter(lambda s: lo <= len(s) <= hi)
    return st.from_regex(pattern, fullmatch=True).filter(lambda s: lo <= len(s) <= hi)


def invalid_value(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A value the schema refuses (or at least one it does not expect): wrong type or out of range."""
    kind = schema.get("type")
    options: list[st.SearchStrategy[Any]] = [ANY_JSON.filter(lambda v: not _same_type(v, kind))]
    if kind in ("integer", "number"):
        if "maximum" in schema:
            options.append(st.integers(int(schema["maximum"]) + 1, int(schema["maximum"]) + 10**20))
        if "minimum" in schema:
            options.append(st.integers(int(schema["minimum"]) - 10**20, int(schema["minimum"]) - 1))
        options.append(st.sampled_from([1e308, -1e308, 0.5, 10**40]))
    if kind == "string":
        options.append(st.just("x" * (schema.get("maxLength", 256) + 1)))
        options.append(st.just("a\x00b"))
    return st.one_of(options)


def _same_type(value: Any, kind: str | None) -> bool:
    return {"integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, int | float) and not isinstance(value, bool),
            "string": isinstance(value, str), "boolean": isinstance(value, bool),
            "array": isinstance(value, list), "object": isinstance(value, dict)}.get(kind or "", False)


# How body_for breaks a body ("valid" twice: half of them are meant to succeed).
BODY_MODES = ("valid", "valid", "bad-field", "unknown-field", "missing", "any-json", "raw", "surrogate", "deep")
UNSTORABLE_MODES = ("surrogate", "deep")


@st.composite
def body_for(draw: st.DrawFn, schema: dict[str, Any] | None, known: dict[str, Any] | None = None,
             example: dict[str, Any] | None = None, modes: tuple[str, ...] = BODY_MODES) -> bytes | None:
    """A request body: valid JSON for the schema, or broken in one way.

    A ``project`` field usually names a project that exists (``known["name"]``),
    so that bodies get past the project check to the code that keeps them. A
    lone surrogate goes into ``example`` (a body the service accepts) when there
    is one: drawn at random, a JobSpec almost never passes the core's own checks,
    and the surrogate would never reach the store, where it used to be a 500.
    """
    if schema is None:
        return draw(st.none() | st.just(b"") | st.binary(max_size=20))
    value = draw(valid(schema))
    names = (known or {}).get("name")
    if names and isinstance(value, dict) and "project" in schema.get("properties", {}) and draw(st.integers(0, 3)):
        value["project"] = draw(st.sampled_from(names))
    mode = draw(st.sampled_from(modes))
    props = schema.get("properties", {})
    if mode == "surrogate":
        base = copy.deepcopy(example) if example is not None and draw(st.booleans()) else value
        return json.dumps(_with_surrogate(draw, schema, base)).encode()  # ensure_ascii: "\\ud800" escapes
    if mode == "deep" and props:
        name = json.dumps(draw(st.sampled_from(sorted(props))))
        return f'{{{name}: {draw(DEEP_JSON)}}}'.encode()
    if mode == "bad-field" and props:
        name = draw(st.sampled_from(sorted(props)))
        value[name] = draw(invalid_value(props[name]))
    elif mode == "unknown-field":
        value[draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in props))] = draw(ANY_JSON)
    elif mode == "missing" and schema.get("required"):
        value.pop(draw(st.sampled_from(schema["required"])), None)
    elif mode == "any-json":
        value = draw(ANY_JSON)
    elif mode == "raw":
        return draw(st.sampled_from([b"{", b"[1,", b'{"project": NaN}', b"\xff\xfe", b'"' * 3, b"{}" * 3,
                                     b"[" * 5000 + b"]" * 5000, b'{"a":' * 100000])
                    | st.binary(max_size=30))
    return json.dumps(value).encode()


def _with_surrogate(draw: st.DrawFn, schema: dict[str, Any], value: Any) -> Any:
    """``value`` with one string (a string field, an item of a list, a map's key or value) holding a lone surrogate."""
    props = {k: v for k, v in schema.get("properties", {}).items() if v.get("type") in ("string", "array", "object")}
    if not props or not isinstance(value, dict):
        return draw(SURROGATE_TEXT)
    name = draw(st.sampled_from(sorted(props)))
    kind = props[name].get("type")
    bad = draw(SURROGATE_TEXT)
    if kind == "array":
        value[name] = ["ok", bad]
    elif kind == "object":
        value[name] = draw(st.sampled_from([{"KEY": bad}, {bad: "v"}]))
    else:
        value[name] = bad
    return value


@st.composite
def request_for(draw: st.DrawFn, op: Operation, known: dict[str, Any],
                modes: tuple[str, ...] = BODY_MODES) -> tuple[str, str, bytes | None]:
    """(method, path with query, body) for one operation; path values favour ids that exist."""
    path = op.path
    for name in op.path_params:
        value = draw(st.sampled_from(known.get(name, ["x"])) | WEIRD_TEXT.filter(bool))
        path = path.replace("{" + name + "}", urllib.parse.quote(value, safe=""))
    query = []
    for name, schema in op.query.items():
        choice = draw(st.sampled_from(["skip", "valid", "weird"]))
        if choice == "valid":
            value = draw(valid(schema))
            query.append((name, str(value).lower() if isinstance(value, bool) else str(value)))
        elif choice == "weird":
            query.append((name, draw(WEIRD_TEXT)))
    if query:
        path += "?" + urllib.parse.urlencode(query)
    example = known.get("examples", {}).get(f"{op.method} {op.path}")
    return op.method, path, draw(body_for(op.body_schema, known, example, modes))
