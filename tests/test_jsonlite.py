"""gpupool.client.jsonlite gives json's own text and values (it is the CLI's JSON, without importing json)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.client import jsonlite

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(values)
def test_same_text_as_json_and_back(value):
    text = jsonlite.dumps(value)
    assert text == json.dumps(value)
    assert jsonlite.loads(text) == json.loads(text)
    assert jsonlite.loads(text.encode()) == json.loads(text)
    assert jsonlite.loads(f" \n{text}\t ") == value or value != value


def test_constants_and_errors_like_json():
    assert math.isnan(jsonlite.loads("NaN")) and jsonlite.loads("-Infinity") == float("-inf")
    for bad in ("", "  ", "[1,", "{} x", "nul", "'a'", '{"a" 1}'):
        with pytest.raises(ValueError):
            jsonlite.loads(bad)
        with pytest.raises(ValueError):
            json.loads(bad)
    with pytest.raises(TypeError):
        jsonlite.dumps({"a": object()})
    circular: list = []
    circular.append(circular)
    with pytest.raises(ValueError):
        jsonlite.dumps(circular)
