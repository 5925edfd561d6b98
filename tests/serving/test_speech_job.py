"""``SpeechJob``: one utterance as a value, and the engine ``Request`` it becomes."""

from __future__ import annotations

import dataclasses

import pytest

from voxwire.engine import SynthesisParams
from voxwire.serving.speech.service import SpeechJob, UtteranceOptions


def test_the_options_reach_the_engine_request() -> None:
    options = UtteranceOptions("narrator", playback_lead_s=0.3, playback_due=12.5)
    job = SpeechJob("ws-1", "Hello.", SynthesisParams(seed=4), options=options)
    request = job.request()
    assert (request.request_id, request.text) == ("ws-1", "Hello.")
    assert request.params == SynthesisParams(seed=4) and request.prompt is None
    assert (request.persona, request.playback_lead_s, request.playback_due) == ("narrator", 0.3, 12.5)


def test_a_plain_job_is_the_base_model_with_the_engine_defaults() -> None:
    request = SpeechJob("http-0", "Hi.", SynthesisParams()).request()
    assert (request.persona, request.playback_lead_s, request.playback_due) == (None, None, None)


def test_a_job_is_immutable() -> None:
    job = SpeechJob("http-0", "Hi.", SynthesisParams())
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.text = "Changed."  # type: ignore[misc]
