"""Read-side views: UTF-8-safe log chunks and job-list filters."""

from __future__ import annotations

import pytest

from gpupool.service.views import job_filters, read_log_chunk
from gpupool.wire.errors import InvalidRequest


@pytest.mark.parametrize("limit", [4, 5, 7, 64])
def test_log_chunks_never_split_a_character(tmp_path, limit):
    text = "héllo → wörld 🚀 done\n" * 3
    path = tmp_path / "job.log"
    path.write_bytes(text.encode())
    got, offset = "", 0
    while True:
        data, nxt, size = read_log_chunk(path, offset, limit)
        assert nxt > offset or offset >= size
        if nxt == offset:
            break
        assert "\ufffd" not in data
        got, offset = got + data, nxt
    assert got == text


def test_tiny_limits_still_make_progress(tmp_path):
    path = tmp_path / "job.log"
    path.write_bytes("🚀".encode())
    data, nxt, size = read_log_chunk(path, 0, 1)
    assert nxt == 1 and size == 4


def test_missing_log_and_bad_offsets(tmp_path):
    assert read_log_chunk(tmp_path / "none.log", 0, None) == ("", 0, 0)
    for bad in (-1, "0", 1.5, True):
        with pytest.raises(InvalidRequest):
            read_log_chunk(tmp_path / "none.log", bad, None)
    with pytest.raises(InvalidRequest):
        read_log_chunk(tmp_path / "none.log", 0, 0)


def test_job_filters():
    q = job_filters({"state": "running,queued", "kind": "train", "limit": "5"}, max_list=3)
    assert q == {"states": ["running", "queued"], "project": None, "user": None, "kind": "train", "limit": 3}
    for bad in ({"state": "nope"}, {"kind": "x"}, {"limit": "many"}, {"limit": 0}, {"color": "red"}, {"user": 3}):
        with pytest.raises(InvalidRequest):
            job_filters(bad, max_list=10)
