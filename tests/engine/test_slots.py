"""SlotTable: slots stay compacted to 0..n-1 and every release returns the move that keeps them so."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from voxwire.engine import SlotMove
from voxwire.engine.slots import SlotTable


def test_allocates_lowest_slot_and_refills_holes_from_the_top():
    table = SlotTable(4)
    assert [table.allocate(rid) for rid in "abcd"] == [0, 1, 2, 3]
    assert table.release("b") == SlotMove(src=3, dst=1)
    assert table.owners == ("a", "d", "c")
    assert table.release("c") is None  # the last slot leaves no hole
    assert table.owners == ("a", "d")
    assert table.allocate("e") == 2
    assert table.num_free == 1


def test_refuses_double_allocation_and_overflow():
    table = SlotTable(1)
    table.allocate("a")
    with pytest.raises(ValueError, match="already owns slot 0"):
        table.allocate("a")
    with pytest.raises(RuntimeError, match="no free slot"):
        table.allocate("b")


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 7)), max_size=60))
def test_moves_replayed_on_a_pool_keep_rows_and_table_in_sync(ops):
    """Replaying the returned moves on a row array reproduces the table, always compacted."""
    table, rows, next_id = SlotTable(8), [None] * 8, 0
    for allocate, pick in ops:
        if allocate and table.num_free:
            rid = f"r{next_id}"
            next_id += 1
            slot = table.allocate(rid)
            assert rows[slot] is None
            rows[slot] = rid
        elif table.num_used:
            rid = table.owners[pick % table.num_used]
            move = table.release(rid)
            rows[rows.index(rid)] = None
            if move is not None:
                rows[move.dst], rows[move.src] = rows[move.src], None
        assert tuple(rows[: table.num_used]) == table.owners
        assert all(row is None for row in rows[table.num_used :])
        assert all(table.slot_of(rid) == slot for slot, rid in enumerate(table.owners))
