"""``voxwire.devices``: the CUDA device a runner works on, one-copy uploads and reused output buffers (on CPU,
with the page-locked allocator stood in for)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voxwire import devices


def test_only_cuda_devices_take_the_cuda_path() -> None:
    assert devices.cuda_device(torch.device("cpu")) is None
    assert devices.cuda_device(torch.device("cuda", 1)) == torch.device("cuda", 1)


def test_an_upload_is_one_copy_that_gives_every_tensor_back_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[torch.Tensor] = []

    def host_buffer(shape: tuple[int, ...], dtype: torch.dtype, cuda: torch.device | None) -> torch.Tensor:
        made.append(torch.zeros(shape, dtype=dtype))  # no page-locked memory without CUDA
        return made[-1]

    monkeypatch.setattr(devices, "host_buffer", host_buffer)
    tensors = [
        torch.arange(7, dtype=torch.long),
        torch.tensor([[1, 2, 3]], dtype=torch.int32),
        torch.randn(3, 2, 5).to(torch.bfloat16),
        torch.randn(4, 3).t(),  # not contiguous
        torch.empty(0, dtype=torch.long),
        torch.tensor([0.5, 2.0], dtype=torch.float32),
    ]
    uploaded = devices.upload(tensors, torch.device("cpu"), torch.device("cuda", 0))
    assert len(made) == 1, "one staging buffer per upload"
    for before, after in zip(tensors, uploaded, strict=True):
        assert after.dtype == before.dtype and after.shape == before.shape
        assert torch.equal(after, before)
        assert after.untyped_storage().data_ptr() == uploaded[0].untyped_storage().data_ptr()  # one copy


def test_an_output_buffer_is_reused_only_once_nothing_views_it() -> None:
    outputs = devices.HostOutputs((4, 3), torch.float32, None)
    first = outputs.take()
    chunks = tuple(outputs.lend(first)[:2])
    assert outputs.take() != first, "a buffer a chunk still views was handed out again"
    assert outputs.count == 2
    del chunks
    assert outputs.take() == first
    assert outputs.count == 2
    array = outputs.lend(first)
    assert isinstance(array, np.ndarray) and array.shape == (4, 3)
