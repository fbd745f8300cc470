"""JobSpec and project validation: any JSON input gives a spec or a clear InvalidRequest, never a crash."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.service.validation import PoolLimits, validate_project, validate_spec
from gpupool.wire.errors import InvalidRequest

LIMITS = PoolLimits(models={"A100-80GB": 80 * 1024**3, "T4": 16 * 1024**3}, max_gpus={"build": 2, "train": 4},
                    cpu=16.0, memory=64 * 1024**3, total_gpus=4)

# Strings a JSON body can carry but UTF-8 cannot: lone surrogates ("\\ud800" decodes to one).
SURROGATE_TEXT = st.text(st.sampled_from(["a", "é", "\ud800", "\udfff", "\U0001f600"]), min_size=1, max_size=6)
DEEP = st.integers(60, 300).map(lambda n: json.loads("[" * n + "]" * n))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.just(10**400) | st.floats(allow_nan=True)
    | st.text(max_size=20) | SURROGATE_TEXT | DEEP,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
fields = st.sampled_from(["project", "kind", "name", "gpus", "gpu_fraction", "gpu_memory", "gpu_model", "priority",
                          "command", "workdir", "env", "cpu", "memory", "labels", "client_key", "image"])
spec_like = st.dictionaries(fields, json_values, max_size=8).map(lambda d: {"project": "p", **d})


@settings(max_examples=300, deadline=None)
@given(spec_like)
def test_any_spec_is_accepted_or_refused_clearly(spec):
    try:
        js = validate_spec(spec, {"p"}, LIMITS)
    except InvalidRequest as e:
        assert e.message and "\n" not in e.message
        return
    json.dumps(dataclasses.asdict(js), ensure_ascii=False).encode("utf-8")  # storable: no lone surrogates
    req = js.request()
    assert sum(1 for k in ("gpu_fraction", "gpu_memory") if req[k] is not None) + (1 if js.gpus else 0) <= 1
    assert js.kind in ("train", "build")
    assert (js.command is not None) == (js.kind == "train")
    if js.gpu_fraction is not None:
        assert 0 < js.gpu_fraction < 1
    if js.image is not None:
        assert 0 < len(js.image) <= 512 and js.image.isprintable() and not any(c.isspace() for c in js.image)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["build_quota", "train_guarantee", "train_limit", "weight"]), json_values,
                       max_size=4))
def test_any_project_fields_are_accepted_or_refused_clearly(fields_):
    try:
        out = validate_project("vision", fields_, total_gpus=4)
    except InvalidRequest as e:
        assert e.message
        return
    json.dumps(out, ensure_ascii=False).encode("utf-8")
    for k, v in out.items():
        if k.endswith("_milli") and v is not None:
            assert isinstance(v, int) and 0 <= v <= 4000


def test_spec_normalisation():
    js = validate_spec({"project": "p", "gpu_model": "a100-80gb", "gpus": 2, "command": ["python", "train.py"]},
                       {"p"}, LIMITS)
    assert js.gpu_model == "A100-80GB" and js.name == "train.py" and js.priority == 0
    assert js.request() == {"gpus": 2, "gpu_fraction": None, "gpu_memory": None, "gpu_model": "A100-80GB",
                            "cpu": None, "memory": None}


@pytest.mark.parametrize("image", ["", " ", "busybox latest", "busybox\tx", "a\nb", "x\x00", "x\x7f", "x\x85",
                                   "x\u2028", "i" * 513, 5, ["busybox"]])
def test_a_bad_image_is_refused_with_the_rule(image):
    with pytest.raises(InvalidRequest, match="image must be a container image reference .*1-512 characters"):
        validate_spec({"project": "p", "command": ["x"], "image": image}, {"p"}, LIMITS)


def test_an_image_is_kept_for_a_train_job_and_refused_for_a_build_job():
    for image in ("registry.example/x:2", "ghcr.io/org/train@sha256:" + "a" * 64, "i" * 512):
        assert validate_spec({"project": "p", "command": ["x"], "image": image}, {"p"}, LIMITS).image == image
    assert validate_spec({"project": "p", "command": ["x"]}, {"p"}, LIMITS).image is None
    with pytest.raises(InvalidRequest, match="a build job has no image"):
        validate_spec({"project": "p", "kind": "build", "gpu_fraction": 0.5, "image": "busybox"}, {"p"}, LIMITS)


def test_default_names_are_short():
    from gpupool.service.validation import default_name

    assert default_name(["python", "train.py", "--lr", "0.1"], "train", "p") == "train.py"
    assert default_name(["/usr/bin/python3", "-u", "-m", "pkg.run"], "train", "p") == "pkg.run"
    assert default_name(["python", "-c", "x = 1\n" * 100], "train", "p") == "python -c"
    assert default_name(["./run.sh"], "train", "p") == "run.sh"
    assert default_name(None, "build", "vision") == "build-vision"
    js = validate_spec({"project": "p", "command": ["python", "-c", "print(1)\n" * 100]}, {"p"}, LIMITS)
    assert js.name == "python -c"


def test_names_with_a_trailing_newline_are_refused():
    """A name is checked whole: "alice\\n" is not "alice" (a regex "$" alone lets a final newline through)."""
    from gpupool.service.validation import validate_user

    assert validate_user("alice") == "alice"
    with pytest.raises(InvalidRequest, match="user names"):
        validate_user("alice\n")
    assert validate_project("vision", {}, 4) == {}
    with pytest.raises(InvalidRequest, match="project names"):
        validate_project("vision\n", {}, 4)
    ok = {"project": "p", "command": ["python", "t.py"]}
    assert validate_spec({**ok, "env": {"SEED": "1"}}, {"p"}, LIMITS).env == {"SEED": "1"}
    with pytest.raises(InvalidRequest, match="env"):
        validate_spec({**ok, "env": {"SEED\n": "1"}}, {"p"}, LIMITS)


LONE = "\ud800"
OK_SPEC = {"project": "p", "command": ["python", "t.py"]}


@pytest.mark.parametrize("change", [
    {"name": LONE}, {"client_key": LONE + "k"}, {"command": ["python", LONE]}, {"workdir": "/" + LONE},
    {"env": {"SEED": LONE}}, {"labels": {"a": "b" + LONE}}, {"labels": {LONE: "b"}}, {"gpu_model": LONE},
])
def test_lone_surrogates_are_refused_in_every_string_field(change):
    with pytest.raises(InvalidRequest, match=r"not valid Unicode \(a lone surrogate \\ud800"):
        validate_spec({**OK_SPEC, **change}, {"p"}, LIMITS)


def _with_string(where: str, text: str) -> dict:
    """OK_SPEC with ``text`` placed in one string field, as a client could send it."""
    return OK_SPEC | {"name": {"name": text}, "client_key": {"client_key": text}, "command": {"command": ["python", text]},
            "workdir": {"workdir": "/" + text}, "env": {"env": {"A": text}}, "label": {"labels": {"a": text}},
            "label key": {"labels": {text: "a"}}, "gpu_model": {"gpu_model": text}}[where]


STRING_FIELDS = ["name", "client_key", "command", "workdir", "env", "label", "label key", "gpu_model"]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(STRING_FIELDS), st.text(max_size=8), st.text(max_size=8),
       st.characters(categories=["Cs"]))
def test_any_string_with_a_lone_surrogate_is_refused(where, before, after, surrogate):
    with pytest.raises(InvalidRequest, match="not valid Unicode"):
        validate_spec(_with_string(where, before + surrogate + after), {"p"}, LIMITS)


def test_lone_surrogates_are_refused_in_project_fields_and_user_names():
    from gpupool.service.validation import validate_user

    with pytest.raises(InvalidRequest, match="not valid Unicode"):
        validate_project("vision", {LONE: 1}, 4)
    with pytest.raises(InvalidRequest):
        validate_user("al" + LONE)


@pytest.mark.parametrize(("raw", "fragment"), [
    (b"[" * 100_000, "nested too deeply (at most 64 levels"),
    (b"[" * 65 + b"]" * 65, "nested too deeply"),
    (b'{"name": "\\ud800"}', "name: the string is not valid Unicode (a lone surrogate \\ud800 at character 0)"),
    (b'{"a": {"\\udfff": 1}}', "a: a key is not valid Unicode"),
    (b'{"x": NaN}', "NaN is not a JSON number"),
    (b"\xff", "not UTF-8"),
])
def test_decode_json_refuses_what_cannot_be_kept(raw, fragment):
    from gpupool.wire.limits import decode_json

    with pytest.raises(InvalidRequest) as info:
        decode_json(raw)
    assert fragment in info.value.message


def test_decode_json_accepts_64_levels_and_any_valid_unicode():
    from gpupool.wire.limits import decode_json

    assert decode_json(b"[" * 64 + b"]" * 64) is not None
    assert decode_json(rb'{"k\u00e9": "\ud83d\ude00 \u00e9"}') == {"ké": "\U0001f600 é"}
