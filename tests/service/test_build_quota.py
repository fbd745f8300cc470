"""How the build-quota refusal writes shares: the way users pick them in the Launcher."""

from __future__ import annotations

import pytest

from gpupool.service.build_quota import gpus_phrase, share_text


@pytest.mark.parametrize("milli, text", [(1000, "1"), (250, "¼"), (500, "½"), (750, "¾"), (1500, "1½"),
                                         (3000, "3"), (300, "0.3"), (1234, "1.234"), (0, "0")])
def test_share_text(milli, text):
    assert share_text(milli) == text


def test_gpus_phrase_agrees_in_number():
    assert [gpus_phrase(m) for m in (1000, 250, 2000, 0)] == ["1 GPU", "¼ GPU", "2 GPUs", "0 GPUs"]
