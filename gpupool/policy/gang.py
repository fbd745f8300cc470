"""One multi-node gang as the cycle sees it: the :class:`Gang` record.

The rules for gangs are in :mod:`gpupool.policy.gangs`. The record is
shared by the cycle state and every gang phase (set-up, a gang's turn, gang
reclaim), so it sits below all of them and depends on the model only; what
is done to all of a gang's replicas at once is in
:mod:`gpupool.policy.gang_actions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from gpupool.policy import reasons as txt
from gpupool.policy.model import MILLI, Request, Workload


@dataclass
class Gang:
    """The replicas of one gang present in the snapshot, in replica order (job order)."""

    id: str
    project: str
    size: int
    request: Request  # one replica's request (interned when pending)
    members: list[Workload]
    running: list[Workload]
    pending: list[Workload]

    @property
    def leader(self) -> Workload:
        """The first replica: the gang takes its turn in the queue where this one would."""
        return self.members[0]

    @property
    def need(self) -> int:
        return self.size * self.request.gpus * MILLI

    _text: str | None = None

    @property
    def text(self) -> str:
        """:meth:`describe`, built once (a waiting gang's reasons name it several times a cycle).

        (A plain attribute filled on first use: ``functools.cached_property``
        takes a lock on every read in Python 3.11, a cost paid by each of a
        queue's gangs each cycle.)
        """
        text = self._text
        if text is None:
            text = self._text = self.describe()
        return text

    def describe(self) -> str:
        """E.g. "gang g7 of 2 × 8 GPUs" (models, CPU and memory per replica added when asked)."""
        return f"gang {self.id} of {_replicas_text(self.size, self.request)}"


@lru_cache(maxsize=1024)
def _replicas_text(size: int, r: Request) -> str:
    """"2 × 8 GPUs" and what each replica asks beyond GPUs (a queue's gangs share a few shapes: built once each)."""
    per = txt.describe(Request(gpus=1, gpu_models=r.gpu_models, cpu_milli=r.cpu_milli, memory_mib=r.memory_mib))
    return f"{size} × {txt.gpus(r.gpus * MILLI)}" + per[len("1 whole GPU"):]
