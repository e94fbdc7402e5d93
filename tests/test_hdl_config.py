"""ChipConfig validation and derived sizes."""

import dataclasses

import pytest

from mxu.hdl import ChipConfig


def test_default_is_the_simulation_chip():
    c = ChipConfig()
    assert (c.rows, c.cols) == (16, 16)
    assert c.vmem_row_elems == 16 and c.vmem_rows == (1 << 20) // 32
    assert c.acc_rows == (512 << 10) // 64


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ChipConfig().rows = 3


@pytest.mark.parametrize("field,value,message", [
    ("rows", 0, "ChipConfig.rows must be a positive integer, not 0"),
    ("cols", 2.5, "ChipConfig.cols must be a positive integer, not 2.5"),
    ("mac_stages", 0, "ChipConfig.mac_stages must be 1 to 7, not 0"),
    ("vpu_stages", 6, "ChipConfig.vpu_stages must be 1 to 5, not 6"),
    ("axi_data_bits", 96, "ChipConfig.axi_data_bits must be 64, 128, 256 or 512, not 96"),
    ("vmem_banks", 3, "ChipConfig.vmem_banks must be a power of two, not 3"),
    ("ext_mem_bytes", 3 << 20, "ChipConfig.ext_mem_bytes must be a power of two"),
])
def test_rejects(field, value, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        ChipConfig(**{field: value})


@pytest.mark.parametrize("changes, message", [
    (dict(weight_rows_per_cycle=3), "ChipConfig.weight_rows_per_cycle must be a power of two no "
                                    "larger than vmem_banks (2), not 3"),
    (dict(weight_rows_per_cycle=0), "ChipConfig.weight_rows_per_cycle must be a power of two no "
                                    "larger than vmem_banks (2), not 0"),
    (dict(weight_rows_per_cycle=4), "ChipConfig.weight_rows_per_cycle must be a power of two no "
                                    "larger than vmem_banks (2), not 4"),
    (dict(vmem_banks=1), "ChipConfig.weight_rows_per_cycle must be a power of two no "
                         "larger than vmem_banks (1), not 2"),
])
def test_weight_rows_per_cycle_fits_the_banks(changes, message):
    """The rows of one weight beat are read from distinct VMEM banks in one cycle."""
    with pytest.raises(ValueError) as info:
        ChipConfig(**changes)
    assert str(info.value) == message


@pytest.mark.parametrize("rows, width, cycles", [(16, 2, 8), (16, 1, 16), (3, 2, 2), (1, 2, 1),
                                                 (8, 4, 2)])
def test_weight_load_cycles(rows, width, cycles):
    c = ChipConfig(rows=rows, vmem_banks=4, weight_rows_per_cycle=width)
    assert c.weight_load_cycles == cycles


def test_non_square_rows_hold_the_wider_side():
    c = ChipConfig(rows=4, cols=12)
    assert c.vmem_row_elems == 12 and c.acc_row_bytes == 48


def test_presets():
    assert ChipConfig.preset("default") == ChipConfig()
    assert ChipConfig.preset("vpu") == ChipConfig(vpu=True, acc_banks=4)
    llm = ChipConfig.preset("llm")
    # The decoder's weights (SmolLM2-135M in bf16, 269 MB) and its caches fit.
    assert llm.vpu and llm.ext_mem_bytes >= 512 << 20
    # ... and a prefill's row-wise epilogues hold whole rows of 576 in one M block.
    assert llm.acc_bytes == 1 << 20
    assert llm.replace(ext_mem_bytes=ChipConfig().ext_mem_bytes,
                       acc_bytes=ChipConfig().acc_bytes) == ChipConfig.preset("vpu")
    fpga = ChipConfig.preset("fpga")
    assert (fpga.rows, fpga.cols, fpga.mac_stages) == (4, 4, 7)
    # The fpga chip keeps the narrow weight port; the simulation chips take two rows.
    assert fpga.weight_rows_per_cycle == 1 and ChipConfig().weight_rows_per_cycle == 2
    # ... and the weight expander with every format (docs/synth.md).
    assert fpga.quant_formats == ChipConfig().quant_formats
    assert set(fpga.quant_formats) == {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"}
    with pytest.raises(ValueError, match="unknown ChipConfig preset 'asic'"):
        ChipConfig.preset("asic")


def test_fpga_llm_preset():
    """The LLM chip for the LFE5U-85F (docs/synth.md): the vector unit with
    pipelined fp32 units, one lane (cols) beside an 8-row array, SmolLM2's
    weights in external memory, the fpga chip's bus and PE depth; the
    simulation presets keep one-stage units (their cycles unchanged)."""
    c = ChipConfig.preset("fpga-llm")
    fpga, llm = ChipConfig.preset("fpga"), ChipConfig.preset("llm")
    assert c.vpu and c.vpu_stages == 5 and (c.rows, c.cols) == (8, 1)
    assert c.ext_mem_bytes == llm.ext_mem_bytes and c.ext_mem_bytes <= 1 << c.axi_addr_bits
    assert (c.axi_data_bits, c.mac_stages) == (fpga.axi_data_bits, fpga.mac_stages)
    assert c.quant_formats == () and c.acc_banks == 4
    assert all(ChipConfig.preset(p).vpu_stages == 1 for p in ("default", "vpu", "llm", "pod"))


def test_measured_fmax_is_by_preset_with_its_commit_and_seed():
    """Each measured clock names a preset, the commit of its run and the
    seed (docs/synth.md); the llm chip was never routed, so it has none."""
    import re

    from mxu.hdl.config import _PRESETS, MEASURED_FMAX_MHZ, MeasuredFmax
    assert MEASURED_FMAX_MHZ and "llm" not in MEASURED_FMAX_MHZ
    for preset, fmax in MEASURED_FMAX_MHZ.items():
        assert preset in _PRESETS and isinstance(fmax, MeasuredFmax)
        assert fmax.mhz > 0 and re.fullmatch(r"[0-9a-f]{7,40}", fmax.commit)
        assert isinstance(fmax.seed, int) and fmax.seed >= 1
    assert str(MEASURED_FMAX_MHZ["fpga"]) == "55.91 MHz (commit 00b4d5c, seed 2)"
    assert str(MEASURED_FMAX_MHZ["fpga-llm"]) == "53.13 MHz (commit b3353d7, seed 1)"
