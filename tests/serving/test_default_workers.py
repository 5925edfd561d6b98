"""``--workers`` defaults to one frontend per spare core: the usable cores (affinity, container quota) less one."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxwire.serving import server_config
from voxwire.serving.server_config import ServerConfig, spare_cores


@pytest.mark.parametrize(
    ("cores", "cpu_max", "workers"),
    [
        (8, None, 7),  # no cgroup file
        (8, "max 100000", 7),  # cgroup without a quota
        (64, "400000 100000", 3),  # a 4-CPU container on a 64-core node
        (8, "150000 100000", 1),  # 1.5 CPUs round up to 2
        (1, None, 1),  # at least one frontend
        (2, "50000 100000", 1),
    ],
)
def test_default_workers_is_one_per_spare_core(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cores: int, cpu_max: str | None, workers: int
) -> None:
    monkeypatch.setattr(server_config.os, "sched_getaffinity", lambda pid: set(range(cores)))
    limit = tmp_path / "cpu.max"
    if cpu_max is not None:
        limit.write_text(cpu_max + "\n")
    monkeypatch.setattr(server_config, "CGROUP_CPU_MAX", limit)
    assert spare_cores() == workers
    assert ServerConfig().topology.workers == workers
    assert ServerConfig.of(workers=0).topology.workers == 0, "--workers 0 stays the single-process mode"
