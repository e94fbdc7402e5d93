"""`mxu synth` and `mxu export`: the command line, the configuration flags, a
generic Yosys smoke test on one PE, and the exported Verilog's port list. The
ECP5 place-and-route runs are benches (bench/synth.py), not tests."""

import json

import pytest

from amaranth.lib.wiring import In, Out

from mxu.hdl.config import ChipConfig
from mxu.hdl.dma import Dma
from mxu.synth import cli
from mxu.synth.blocks import PortSubset, block_unit
from mxu.synth.run import Ecp5Options, design, nextpnr_args


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_config_flags():
    parser = cli.argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["synth", "--preset", "fpga", "--rows", "4", "--mac-stages", "3",
                              "--vmem-bytes", "32K", "--acc-bytes", "16KiB"])
    config = cli.config_from_args(args)
    assert config == ChipConfig.preset("fpga").replace(rows=4, mac_stages=3, vmem_bytes=32 << 10,
                                                       acc_bytes=16 << 10)
    assert args.unit == "chip" and args.target == "generic"


@pytest.mark.parametrize("argv, message", [
    (["synth", "--preset", "asic"], "mxu synth: error: unknown ChipConfig preset 'asic'"),
    (["synth", "--rows", "0"], "mxu synth: error: ChipConfig.rows must be a positive integer"),
    (["export", "--mac-stages", "9", "-o", "x.v"], "mxu export: error: ChipConfig.mac_stages"),
])
def test_errors(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.startswith(message)


def test_bad_size(capsys):
    with pytest.raises(SystemExit):
        cli.main(["synth", "--vmem-bytes", "lots"])
    assert "a size in bytes looks like 65536, 64K or 1MiB" in capsys.readouterr().err


def test_ecp5_options():
    with pytest.raises(ValueError, match="unknown ECP5 device 'LFE5U-99F'"):
        Ecp5Options(device="LFE5U-99F")
    args = nextpnr_args(Ecp5Options(device="LFE5U-45F", timing_driven=False))
    assert "--45k" in args and "--no-tmdriv" in args and "--package" in args
    args = nextpnr_args(Ecp5Options(placer="static"))
    assert args[args.index("--placer") + 1] == "static"
    with pytest.raises(ValueError, match="placer must be one of heap, sa, static, not 'anneal'"):
        Ecp5Options(placer="anneal")


def test_generic_pe_smoke(capsys, tmp_path):
    """One PE through Yosys generic synthesis, per-block table and JSON (seconds)."""
    report_file = tmp_path / "pe.json"
    code, out, _ = run(capsys, "synth", "--unit", "pe", "--quiet", "--workdir",
                       str(tmp_path / "work"), "--json", str(report_file))
    assert code == 0
    for block in ("MAC multiplier", "MAC adder: align", "MAC adder: round", "PE", "total"):
        assert block in out
    report = json.loads(report_file.read_text())["report"]
    blocks = {b["block"]: b for b in report["blocks"]}
    assert blocks["PE"]["flip_flops"] > 0 and blocks["MAC multiplier"]["transistors"] > 0
    assert report["total_cells"] == sum(b["cells"] for b in report["blocks"])
    assert (tmp_path / "work" / "yosys.log").exists()


def test_tool_failure_names_the_log(capsys, tmp_path, monkeypatch):
    from mxu.synth import run as run_module
    monkeypatch.setattr(run_module, "_GENERIC_SCRIPT", "this_is_not_a_yosys_command\n")
    code, _, err = run(capsys, "synth", "--unit", "mac", "--quiet", "--workdir", str(tmp_path))
    assert code == 2
    assert "Yosys (generic synth) failed" in err and str(tmp_path / "yosys.log") in err


def test_export(capsys, tmp_path):
    out_file = tmp_path / "chip.v"
    code, out, _ = run(capsys, "export", "--preset", "fpga", "--rows", "2", "--cols", "2",
                       "-o", str(out_file))
    assert code == 0 and "wrote" in out
    text = out_file.read_text()
    assert text.startswith("// mxu chip, module `top`: ChipConfig(2x2")
    for port in ("axi__awaddr", "host__wdata", "irq"):
        assert f"//     {port}" in text or f"//   {port}" in text
    assert "module mxu_pe_s" in text and "module top(" in text


def test_export_vpu_chip_shares_its_lane(capsys, tmp_path):
    """A chip with the vector unit exports its fp32 units and lane once, each
    instantiated by name (as `mxu synth` builds it), and says so in the header."""
    out_file = tmp_path / "chip.v"
    code, out, _ = run(capsys, "export", "--preset", "fpga", "--vpu", "--rows", "2", "--cols",
                       "2", "--quiet", "-o", str(out_file))
    assert code == 0 and "wrote" in out
    text = out_file.read_text()
    for module in ("mxu_fp32_add", "mxu_fp32_mul", "mxu_fp32_scale", "mxu_vpu_lane"):
        assert text.count(f"module {module}(") == 1, module
    assert text.count("  mxu_vpu_lane ") == 2                 # one instance per column
    assert "// The vector lane is module `mxu_vpu_lane`, instantiated 2 times" in text


def test_design_units():
    config = ChipConfig.preset("fpga").replace(rows=2, cols=2)
    pe = design("pe", config, target="ecp5")
    assert pe.wrapper == "registered ports" and pe.wrapper_ffs > 100 and pe.pes == 1
    chip = design("chip", config, target="ecp5")
    assert chip.wrapper == "serial ports" and chip.pes == 4
    assert design("array", config, target="generic").wrapper == "none"
    with pytest.raises(ValueError, match="unit must be one of mac, pe, array, chip, vpu"):
        design("dma", config, target="generic")


def test_design_vpu_shares_its_units():
    """The VPU's fp32 adder, multiplier and lane are each defined once and
    instantiated by name, so Yosys synthesises one of each (docs/vpu.md)."""
    config = ChipConfig(cols=3)
    vpu = design("vpu", config, target="generic")
    assert vpu.name == "vpu3" and vpu.wrapper == "none"
    for module in ("mxu_fp32_add", "mxu_fp32_mul", "mxu_vpu_lane"):
        assert vpu.verilog.count(f"module {module}(") == 1
    assert vpu.verilog.count("  mxu_vpu_lane lane") == 3     # one instance per lane
    assert design("vpu", config, target="ecp5").wrapper == "serial ports"


def test_pipelined_vpu_modules_and_blocks():
    """With `vpu_stages` above 1 the fp32 units are generated pipelined (an
    ``en`` port, clocked) and the lane instantiates them so; the guard's
    vector blocks are built at the fpga-llm preset's depth, and the tree with
    4 columns (its one column has none)."""
    from mxu.synth.guard import BLOCK_PRESETS, FLOORS, block_config
    from mxu.synth.verilog import vpu_modules_verilog
    prelude, modules = vpu_modules_verilog(4)
    assert modules["staged"] == ("fadd", "fmul", "fscale")
    for module in ("mxu_fp32_add", "mxu_fp32_mul", "mxu_fp32_scale"):
        head = prelude[prelude.index(f"module {module}("):]
        assert "en" in head[:head.index(");")].replace(" ", "").split(",")
    llm = ChipConfig.preset("fpga-llm")
    assert set(BLOCK_PRESETS) - {"lane"} <= set(FLOORS)
    assert block_config("lane_fmul") == llm and block_config("pe") == ChipConfig.preset("fpga")
    assert block_config("tree").cols == 4 and block_config("tree").vpu_stages == llm.vpu_stages
    for name in ("lane_fadd", "lane_fmul"):
        unit = block_unit(name, llm)
        assert unit.stages == llm.vpu_stages and "en" in unit.signature.members
    assert design("tree", block_config("tree"), target="ecp5").wrapper == "serial ports"


def test_block_units():
    """The chip's blocks for the timing guard: each as the chip builds it, with
    the ports the chip leaves unused tied off (docs/synth.md, "Timing guard")."""
    config = ChipConfig.preset("fpga")
    load, store = block_unit("load_dma", config), block_unit("store_dma", config)
    load_ports = {path for path, _, _ in load.signature.flatten(load)}
    store_ports = {path for path, _, _ in store.signature.flatten(store)}
    assert ("axi", "araddr") in load_ports and ("axi", "rdata") in load_ports
    assert not any(p[0] in ("vmem_read", "acc_read") or p[:2] == ("axi", "wdata")
                   for p in load_ports)
    assert ("axi", "wdata") in store_ports and ("axi", "bresp") in store_ports
    assert not any(p[0] in ("vmem_write", "acc_write") or p[:2] == ("axi", "rdata")
                   for p in store_ports)
    # Directions survive the filter: the load DMA takes commands and R beats.
    members = dict(((p, m.flow) for p, m, _ in load.signature.flatten(load)))
    assert members[("cmd", "valid")] == In and members[("cmd", "ready")] == Out
    assert members[("axi", "rvalid")] == In and members[("axi", "arvalid")] == Out
    for name in ("load_dma", "controller", "regs", "fetch", "loop"):
        unit = design(name, config, target="ecp5")
        assert unit.name == name and unit.wrapper == "serial ports" and unit.wrapper_ffs > 0
    expander = design("expander", config, target="ecp5")
    assert expander.wrapper == "registered ports" and expander.wrapper_ffs > 0
    dma = Dma(config)
    dma._MustUse__silence = True                # never elaborated, by design
    with pytest.raises(ValueError, match="PortSubset keeps no port of Dma"):
        PortSubset(dma, lambda path: False)
    with pytest.raises(ValueError, match="unknown block 'alu'"):
        block_unit("alu", config)
