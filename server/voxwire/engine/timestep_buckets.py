"""The timestep-bucket rule: which CFM timestep count a row runs at.

A runner steps its rows at a few timestep counts, its buckets (``RunnerOptions.graph_timesteps`` and
``max_timesteps``; on CUDA each has its graphs). A row asking for ``t`` timesteps runs in the smallest bucket
>= ``t``, with its extra timesteps masked (``CfmSchedule.ragged``), so it costs what its bucket costs. The rule is
stated here once, for the step's groups, the graph a group replays and the row weights the policy budgets with.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def timestep_buckets(max_timesteps: int, graph_timesteps: Sequence[int]) -> tuple[int, ...]:
    """A runner's buckets, ascending: ``graph_timesteps`` and ``max_timesteps``, each once."""
    return tuple(sorted({*graph_timesteps, max_timesteps}))


def bucket_of(buckets: Sequence[int], timesteps: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The bucket each of ``timesteps`` runs in: the smallest of ``buckets`` (ascending) >= it. Takes one count
    or an array of them; a count above the largest bucket is an ``IndexError``."""
    table = np.asarray(buckets, dtype=np.int64)
    return table[np.searchsorted(table, timesteps)]
