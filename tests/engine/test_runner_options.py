"""``RunnerOptions``: a runner needs a slot and positions in a block; anything else is refused on construction."""

from __future__ import annotations

import pytest

from voxwire.engine import RunnerOptions


@pytest.mark.parametrize(("field", "value"), [("num_slots", 0), ("num_slots", True), ("block_size", 0)])
def test_no_slot_or_an_empty_block_is_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{field}={value!r} is invalid"):
        RunnerOptions(**{"num_slots": 1, field: value})  # type: ignore[arg-type]
