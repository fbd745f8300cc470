"""JobSpec and project validation: any JSON input gives a spec or a clear InvalidRequest, never a crash."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.errors import InvalidRequest
from scheduler.service.validation import PoolLimits, validate_project, validate_spec

LIMITS = PoolLimits(models={"A100-80GB": 80 * 1024**3, "T4": 16 * 1024**3}, max_gpus={"build": 2, "train": 4},
                    cpu=16.0, memory=64 * 1024**3, total_gpus=4)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.just(10**400) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
fields = st.sampled_from(["project", "kind", "name", "gpus", "gpu_fraction", "gpu_memory", "gpu_model", "priority",
                          "command", "workdir", "env", "cpu", "memory", "labels", "client_key"])
spec_like = st.dictionaries(fields, json_values, max_size=8).map(lambda d: {"project": "p", **d})


@settings(max_examples=300, deadline=None)
@given(spec_like)
def test_any_spec_is_accepted_or_refused_clearly(spec):
    try:
        js = validate_spec(spec, {"p"}, LIMITS)
    except InvalidRequest as e:
        assert e.message and "\n" not in e.message
        return
    req = js.request()
    assert sum(1 for k in ("gpu_fraction", "gpu_memory") if req[k] is not None) + (1 if js.gpus else 0) <= 1
    assert js.kind in ("train", "build")
    assert (js.command is not None) == (js.kind == "train")
    if js.gpu_fraction is not None:
        assert 0 < js.gpu_fraction < 1


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["build_quota", "train_guarantee", "train_limit", "weight"]), json_values,
                       max_size=4))
def test_any_project_fields_are_accepted_or_refused_clearly(fields_):
    try:
        out = validate_project("vision", fields_, total_gpus=4)
    except InvalidRequest as e:
        assert e.message
        return
    for k, v in out.items():
        if k.endswith("_milli") and v is not None:
            assert isinstance(v, int) and 0 <= v <= 4000


def test_spec_normalisation():
    js = validate_spec({"project": "p", "gpu_model": "a100-80gb", "gpus": 2, "command": ["python", "train.py"]},
                       {"p"}, LIMITS)
    assert js.gpu_model == "A100-80GB" and js.name == "train.py" and js.priority == 0
    assert js.request() == {"gpus": 2, "gpu_fraction": None, "gpu_memory": None, "gpu_model": "A100-80GB",
                            "cpu": None, "memory": None}


def test_default_names_are_short():
    from scheduler.service.validation import default_name

    assert default_name(["python", "train.py", "--lr", "0.1"], "train", "p") == "train.py"
    assert default_name(["/usr/bin/python3", "-u", "-m", "pkg.run"], "train", "p") == "pkg.run"
    assert default_name(["python", "-c", "x = 1\n" * 100], "train", "p") == "python -c"
    assert default_name(["./run.sh"], "train", "p") == "run.sh"
    assert default_name(None, "build", "vision") == "build-vision"
    js = validate_spec({"project": "p", "command": ["python", "-c", "print(1)\n" * 100]}, {"p"}, LIMITS)
    assert js.name == "python -c"


def test_names_with_a_trailing_newline_are_refused():
    """A name is checked whole: "alice\\n" is not "alice" (a regex "$" alone lets a final newline through)."""
    import pytest

    from scheduler.service.validation import validate_user

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
