"""The cycle guard (`bench/cycles.py`, docs/testing.md): the chip cycles of a
fixed set of workloads equal the ones recorded in `bench/cycles.json`,
exactly; and the comparison fails on a one-cycle change of any of them."""

import importlib.util
import re
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "bench" / "cycles.py"
_spec = importlib.util.spec_from_file_location("bench_cycles", _PATH)
cycles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cycles)


def test_every_group_is_recorded():
    assert sorted(cycles.load()) == sorted(cycles.GROUPS)


@pytest.mark.parametrize("group", sorted(cycles.GROUPS))
def test_cycles_are_the_recorded_ones(group):
    cycles.check(cycles.load()[group], cycles.measure(group))


def test_a_one_cycle_change_of_any_workload_fails_naming_it():
    """Every recorded workload, one cycle more or less (a planted change,
    compared without running the simulator again), fails with its name and
    old -> new; a workload missing or new fails too."""
    for group, recorded in cycles.load().items():
        cycles.check(recorded, dict(recorded))
        for name, old in recorded.items():
            for new in (old + 1, old - 1):
                with pytest.raises(AssertionError) as info:
                    cycles.check(recorded, {**recorded, name: new})
                assert f"{name}: {old:,} -> {new:,} cycles" in str(info.value)
                assert str(info.value).count(" -> ") == 1
        name, old = next(iter(recorded.items()))
        with pytest.raises(AssertionError, match=re.escape(f"{name}: {old:,} -> absent")):
            cycles.check(recorded, {k: v for k, v in recorded.items() if k != name})
        with pytest.raises(AssertionError, match="new workload: absent -> 7 cycles"):
            cycles.check(recorded, {**recorded, "new workload": 7})
