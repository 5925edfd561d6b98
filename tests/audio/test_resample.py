"""Stateful resampling: chunking changes nothing and the total length follows the rate ratio."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import soxr

from voxwire.audio.resample import StreamResampler


def resample_in_chunks(samples: np.ndarray, sizes: list[int], input_rate: int, output_rate: int) -> np.ndarray:
    resampler = StreamResampler(input_rate, output_rate)
    parts, position = [], 0
    for size in itertools.cycle(sizes):
        if position >= samples.size:
            break
        parts.append(resampler.process(samples[position : position + size]))
        position += size
    return np.concatenate([*parts, resampler.flush()])


def expected_length(length: int, input_rate: int, output_rate: int) -> int:
    """soxr's total: the exact ratio rounded to nearest, halves up."""
    return (2 * length * output_rate + input_rate) // (2 * input_rate)


@pytest.fixture
def noise() -> np.ndarray:
    return (np.random.default_rng(7).standard_normal(44100 * 2 + 123) * 0.2).astype(np.float32)


@pytest.mark.parametrize(("input_rate", "output_rate"), [(44100, 48000), (48000, 24000), (16000, 24000)])
def test_chunked_equals_one_shot(noise: np.ndarray, input_rate: int, output_rate: int) -> None:
    """Identical to the last bit: soxr's stream keeps its filter state across chunks."""
    one_shot = soxr.resample(noise, input_rate, output_rate, quality="HQ")
    model_chunks = resample_in_chunks(noise, [7056], input_rate, output_rate)
    irregular = resample_in_chunks(noise, [1, 0, 500, 7056, 3], input_rate, output_rate)
    assert model_chunks.dtype == np.float32
    assert model_chunks.size == expected_length(noise.size, input_rate, output_rate)
    np.testing.assert_array_equal(model_chunks, one_shot)
    np.testing.assert_array_equal(irregular, one_shot)


@pytest.mark.parametrize("length", [0, 1, 3, 147, 7056, 7057, 70560])
@pytest.mark.parametrize(("input_rate", "output_rate"), [(44100, 48000), (16000, 24000), (48000, 24000)])
def test_total_length(length: int, input_rate: int, output_rate: int) -> None:
    samples = np.full(length, 0.25, dtype=np.float32)
    resampled = resample_in_chunks(samples, [7056], input_rate, output_rate)
    assert resampled.size == expected_length(length, input_rate, output_rate)


def test_44100_chunks_hold_back_the_filter_delay() -> None:
    """The first 160 ms chunk cannot all come out yet; the held samples appear at flush."""
    resampler = StreamResampler(44100, 48000)
    first = resampler.process(np.zeros(7056, dtype=np.float32))
    assert 7000 < first.size < 7680
    assert first.size + resampler.flush().size == 7680


def test_equal_rates_pass_through() -> None:
    resampler = StreamResampler(16000, 16000)
    chunk = np.linspace(-1, 1, 1280, dtype=np.float32)
    np.testing.assert_array_equal(resampler.process(chunk), chunk)
    assert resampler.flush().size == 0


def test_misuse_is_reported() -> None:
    resampler = StreamResampler(44100, 48000)
    resampler.flush()
    with pytest.raises(RuntimeError, match="flushed"):
        resampler.process(np.zeros(10, dtype=np.float32))
    with pytest.raises(ValueError, match="positive"):
        StreamResampler(0, 48000)
    with pytest.raises(ValueError, match="1-D"):
        StreamResampler(44100, 48000).process(np.zeros((10, 2), dtype=np.float32))
