"""Resampling is deliberately unsupported: reference fixtures feed audio at the model's own rate."""

from __future__ import annotations

import torch


def resample(waveform: torch.Tensor, orig_freq: int, new_freq: int, *args: object, **kwargs: object) -> torch.Tensor:
    if orig_freq == new_freq:
        return waveform
    raise NotImplementedError(f"fixture audio must already be at the model rate ({orig_freq} != {new_freq})")
