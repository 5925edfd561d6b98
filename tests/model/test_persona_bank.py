"""``PersonaBank`` unwrapping (issue 20, item 9): once no persona needs an adapted layer the model gets its own
``nn.Linear`` back, unless the layer was reserved or the bank is sealed (graphs were captured over it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import voxwire
from voxwire.model.lora import LoRAConfig
from voxwire.model.personas import PersonaLinear
from voxwire.params import SynthesisParams
from voxwire.tiny.checkpoint import make_tiny_checkpoint
from voxwire.tts import VoxCPM

LORA = Path(__file__).parents[1] / "fixtures" / "reference" / "lora" / "voxcpm2"
TEXT = "Hello there."
PARAMS = SynthesisParams(seed=3, max_len=8)


@pytest.fixture
def tts(tmp_path_factory: pytest.TempPathFactory) -> VoxCPM:
    folder = make_tiny_checkpoint(tmp_path_factory.mktemp("bank") / "v2", "voxcpm2", seed=0)
    return voxwire.load_model(folder, device="cpu", dtype=torch.float32)


def linears(tts: VoxCPM) -> dict[str, nn.Linear]:
    return {path: module for path, module in tts.model.named_modules() if isinstance(module, nn.Linear)}


def wrapped(tts: VoxCPM) -> set[str]:
    return {path for path, module in linears(tts).items() if isinstance(module, PersonaLinear)}


@pytest.mark.isa
def test_removing_the_last_persona_gives_the_model_its_own_layers_back(tts: VoxCPM) -> None:
    """They stayed ``PersonaLinear`` (slot buffers, a branch per call) after every persona was gone."""
    plain = tts.generate(TEXT, PARAMS)
    before = linears(tts)
    keys = set(tts.model.state_dict())
    bank = tts.enable_personas(max_personas=2, max_rank=16)
    tts.load_persona("A", LORA)
    tts.load_persona("B", LORA)
    adapted = wrapped(tts)
    assert adapted

    bank.remove("A")
    assert wrapped(tts) == adapted  # B adapts them still
    bank.acquire("B")  # a request speaking with B
    bank.remove("B")
    assert wrapped(tts) == adapted  # removed, but still held
    bank.release("B")
    assert wrapped(tts) == set() and not bank.layers
    assert all(linears(tts)[path] is module for path, module in before.items())  # the very same modules
    assert set(tts.model.state_dict()) == keys
    np.testing.assert_array_equal(tts.generate(TEXT, PARAMS), plain)

    tts.load_persona("A", LORA)  # and personas still work afterwards
    assert wrapped(tts) == adapted
    with_a = tts.generate(TEXT, PARAMS, lora="A")
    assert not np.array_equal(with_a[: plain.size], plain[: with_a.size])


def test_reserved_layers_and_a_sealed_banks_layers_stay_adapted(tts: VoxCPM) -> None:
    """A sealed bank's layers are in captured graphs (which replay their slot buffers whatever the module tree
    says) and could not be wrapped again: removal only zeroes the slot. Reserved layers wait for personas."""
    bank = tts.enable_personas(max_personas=2, max_rank=16)
    bank.reserve(LoRAConfig(enable_lm=True))  # the LMs' q/k/v/o
    reserved = wrapped(tts)
    tts.load_persona("A", LORA)  # it adapts the MLPs, the DiT and the projections too
    assert wrapped(tts) > reserved
    bank.remove("A")
    assert wrapped(tts) == reserved

    tts.load_persona("A", LORA)
    everything = wrapped(tts)
    bank.seal()
    bank.remove("A")
    assert wrapped(tts) == everything
    tts.load_persona("A", LORA)  # the sealed bank takes it again: its layers are all there
    assert wrapped(tts) == everything
