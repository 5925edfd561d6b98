"""A request's noise in one launch is the numbers of its patch-by-patch ``torch.randn`` calls on CUDA.

On CPU the kernel runs under the interpreter against a numpy model of torch's CUDA ``randn``
(``curand_model``), which is itself checked against numbers torch printed on a GPU. On a GPU the kernel is
compared with eager ``torch.randn`` directly, as the start-up probe does.
"""

from __future__ import annotations

import logging

import pytest
import torch
from tests.kernels.curand_model import cuda_randn_calls

from voxwire.kernels import noise, path
from voxwire.sampling import NoiseStream

CUDA = torch.device("cuda:0")

# torch.randn([1, 64, 2048], generator=torch.Generator("cuda").manual_seed(42), device="cuda") as printed in
# pytorch/pytorch#158398: the first three and last three numbers of rows 0 and the first three of rows 1 and 2.
# (Its last rows differ between GPUs with different SM counts: a launch that big draws several numbers per
# thread, which a patch never does, so they are left out.)
PUBLISHED_SEED_42 = {
    0: 0.1940,
    1: 2.1614,
    2: -0.1721,
    2045: 1.4540,
    2046: -2.7733,
    2047: -0.8932,
    2048: -0.4574,
    2049: 0.8063,
    2050: 0.1580,
    4096: 1.1346,
    4097: -0.6329,
    4098: -0.9147,
}


def test_the_model_gives_the_numbers_torch_printed_on_a_gpu() -> None:
    drawn = cuda_randn_calls(42, 0, 1, (64 * 2048,))[0]
    for index, printed in PUBLISHED_SEED_42.items():
        assert abs(drawn[index] - printed) <= 5e-5, (index, drawn[index], printed)


def expected_calls(
    seed: int, first_call: int, calls: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Eager ``torch.randn`` on a GPU; off it, the model's numbers rounded to ``dtype`` as torch rounds them."""
    if device.type == "cuda":
        return path.eager_randn_calls(seed, first_call, calls, shape, dtype, device)
    return torch.from_numpy(cuda_randn_calls(seed, first_call, calls, shape)).to(dtype)


@pytest.mark.isa
@pytest.mark.parametrize(
    ("seed", "first_call", "calls", "shape"),
    [
        (42, 0, 1, (64,)),  # the published numbers' stream
        (1, 0, 150, (64, 4)),  # a VoxCPM2 request's length cap, from its seeding
        ((7 << 32) | 12345, 3, 40, (64, 2)),  # both key words; from the middle of the stream
        (5, 2**32 - 2, 4, (8, 4)),  # calls on both sides of the counter's 32-bit carry
    ],
)
def test_one_launch_draws_the_numbers_of_every_call(
    seed: int, first_call: int, calls: int, shape: tuple[int, ...], device: torch.device
) -> None:
    if device.type == "cuda" and first_call > 100:
        pytest.skip("eager draws of 2**32 calls")
    drawn = noise.patch_noise(seed, first_call, calls, shape, torch.float32, device)
    assert drawn.shape == (calls, *shape)
    assert torch.equal(drawn.cpu(), expected_calls(seed, first_call, calls, shape, torch.float32, device).cpu())


@pytest.mark.isa
def test_half_precision_draws_are_the_float_draws_rounded(device: torch.device) -> None:
    # bfloat16 is checked on a GPU only: the interpreter truncates float32 to bfloat16 where CUDA rounds.
    dtypes = (torch.float16, torch.bfloat16) if device.type == "cuda" else (torch.float16,)
    single = noise.patch_noise(9, 2, 30, (64, 4), torch.float32, device)
    for dtype in dtypes:
        assert torch.equal(noise.patch_noise(9, 2, 30, (64, 4), dtype, device), single.to(dtype))


def test_a_call_bigger_than_one_number_per_thread_is_refused() -> None:
    with pytest.raises(ValueError, match="one element per thread"):
        noise.patch_noise(1, 0, 2, (noise.MAX_CALL_ELEMENTS + 1,), torch.float32, torch.device("cpu"))


def test_the_start_up_probe_accepts_equal_numbers_and_names_any_difference(device: torch.device) -> None:
    dtypes = path.NOISE_DTYPES if device.type == "cuda" else (torch.float32, torch.float16)
    assert path.probe_noise(device, expected_calls, dtypes) is None

    def one_number_off(*args: object) -> torch.Tensor:
        numbers = expected_calls(*args)  # type: ignore[arg-type]
        numbers.view(-1)[7] = numbers.view(-1)[7] * 2
        return numbers

    failure = path.probe_noise(device, one_number_off, dtypes)
    assert failure is not None and failure.startswith(f"1 of 1280 {dtypes[0]} numbers")

    def generator_moved_otherwise(*args: object) -> torch.Tensor:
        raise ValueError("3 randn calls moved the generator's offset to 24")

    assert path.probe_noise(device, generator_moved_otherwise, dtypes) == (
        "ValueError: 3 randn calls moved the generator's offset to 24"
    )


def test_noise_takes_one_launch_only_where_the_probe_matched(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=path.logger.name):
        assert path.decide_noise(CUDA, lambda device: None) is path.NoisePath.ONE_LAUNCH
        assert "one launch per request" in caplog.text
        caplog.clear()
        assert path.decide_noise(CUDA, lambda device: "12 of 1280 numbers differ") is path.NoisePath.PER_PATCH
    assert "one launch per patch" in caplog.text and "12 of 1280 numbers differ" in caplog.text
    assert caplog.records[-1].levelno == logging.WARNING


def test_plain_torch_kernels_draw_patch_by_patch_without_probing(monkeypatch: pytest.MonkeyPatch) -> None:
    def probe(device: torch.device) -> str | None:
        raise AssertionError("probed")

    monkeypatch.setitem(path._paths, CUDA, path.KernelPath.TORCH)
    monkeypatch.setattr(path, "probe_noise", probe)
    assert path.noise_path(CUDA) is path.NoisePath.PER_PATCH
    assert path.noise_path(torch.device("cpu")) is path.NoisePath.PER_PATCH


@pytest.mark.isa
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_streams_noise_taken_at_once_equals_its_draws_one_by_one() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    assert path.noise_path(device) is path.NoisePath.ONE_LAUNCH
    at_once, one_by_one = (NoiseStream(77, 64, 4, torch.bfloat16, device) for _ in range(2))
    first = torch.cat([at_once.take(3), at_once.next(), at_once.take(100)])
    second = torch.cat([one_by_one.next() for _ in range(104)])
    assert torch.equal(first, second)
    assert at_once.generator.get_offset() == one_by_one.generator.get_offset()
