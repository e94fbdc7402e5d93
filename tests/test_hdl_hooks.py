"""`BuildHooks`: its checks, and what it changes in `MxuChip`'s interface (no
elaboration, no simulator)."""

import dataclasses

import pytest

from mxu.hdl.config import ChipConfig
from mxu.hdl.hooks import BuildHooks
from mxu.hdl.top import MxuChip


@pytest.mark.parametrize("field", ["pe_module", "datapath_module", "pending_module", "clock_gate"])
def test_module_names_checked(field):
    with pytest.raises(ValueError) as info:
        BuildHooks(**{field: "a b"})
    assert str(info.value) == f"{field} must be a Verilog module name, not 'a b'"


def test_gate_ports_exclude_clock_gate():
    with pytest.raises(ValueError, match="gate_ports and clock_gate exclude each other"):
        BuildHooks(clock_gate="gate", gate_ports=True)


def test_frozen_and_read_only():
    modules = {"lane": "mxu_vpu_lane"}
    hooks = BuildHooks(vpu_modules=modules)
    modules["lane"] = "other"                       # the caller's dict is copied
    assert hooks.vpu_modules["lane"] == "mxu_vpu_lane"
    with pytest.raises(TypeError):
        hooks.vpu_modules["lane"] = "other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        hooks.pe_module = "pe"


def test_gated():
    assert not BuildHooks().gated
    assert BuildHooks(clock_gate="gate").gated
    assert BuildHooks(gate_ports=True).gated


def unelaborated(component):
    component._MustUse__silence = True
    return component


def test_chip_gate_ports():
    """The gate ports appear with ``gate_ports`` only, one pair per gated engine."""
    vpu = ChipConfig(rows=2, cols=2, vpu=True)
    plain = unelaborated(MxuChip(vpu)).signature.members
    gated = unelaborated(MxuChip(vpu, hooks=BuildHooks(gate_ports=True))).signature.members
    assert set(gated) - set(plain) == {"gate_store_clk", "gate_store_awake",
                                       "gate_vector_clk", "gate_vector_awake"}
    assert set(unelaborated(MxuChip(vpu, hooks=BuildHooks(clock_gate="g"))).signature.members) \
        == set(plain)


def test_chip_rejects_other_hooks():
    with pytest.raises(TypeError, match="MxuChip's hooks must be a BuildHooks, not dict"):
        MxuChip(ChipConfig(), hooks={"pe_module": "pe"})
