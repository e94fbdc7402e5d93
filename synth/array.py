"""What the systolic array costs on an ECP5 (LFE5U-85F): LUT, FF and DSP per PE
and Fmax, for 2x2, 4x4 and 8x8 (and a mac_stages sweep on 2x2).

Run: ``python -m mxu.synth.array`` (``--help`` for the options). Each size runs
Yosys ``synth_ecp5`` and ``nextpnr-ecp5`` through `mxu.synth.ecp5.run_ecp5`.

An 8x8 array has ~1,500 data ports, far more than the package's pins, so it is
synthesised inside `ArraySynthWrapper`: every input is a register loaded 16 bits
at a time from a 16-bit pin bus, every result bit is captured into a register
that shifts out 16 bits at a time, and every control pin is registered. Every
array input is thus controllable and every output observable (Yosys cannot
optimise any PE away), the IO count is ~45 pins whatever the size, and every
timing path starts and ends at a register, so Fmax is the array's own.
"""

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mxu.hdl.array import SystolicArray

from .ecp5 import DEVICE, format_table, run_ecp5

# LFE5U-85F capacity (TRELLIS_COMB = LUT4 slots, TRELLIS_FF, MULT18X18D).
CAPACITY = {"LUT": 83640, "FF": 83640, "DSP": 156}

__all__ = ["ArraySynthWrapper", "wrapper_ffs", "main"]

BUS = 16


def _padded(bits):
    return -(-bits // BUS) * BUS


def wrapper_ffs(rows, cols):
    """Flip-flops the wrapper adds around the array (shift registers and pins)."""
    inputs = (16 * rows + 1) + 32 * cols + 16 * cols      # shift-in registers
    pins = (BUS + 2 + 1 + 4 + 1) + (BUS + 6)                 # registered pins
    return inputs + 32 * cols + pins


class ArraySynthWrapper(wiring.Component):
    """`SystolicArray` behind registered, serial IO, for synthesis only.

    Parameters
    ----------
    rows, cols, mac_stages : int
        Passed to `SystolicArray`.

    Interface
    ---------
    din : In(16)
        Data shifted into the register chosen by ``sel`` when ``shift`` is high.
    sel : In(2)
        0: activation beat (incl. ``first``), 1: seed beat, 2: weight row.
    shift : In(1)
    act_valid, seed_valid, weight_valid, result_ready : In(1)
        The array's handshake inputs, registered.
    out_shift : In(1)
        Shift the captured result register by 16 bits.
    dout : Out(16)
        Low 16 bits of the captured result register.
    status : Out(6)
        act/seed/weight ready, result valid, weights_ready, busy (registered).
    """

    din: In(BUS)
    sel: In(2)
    shift: In(1)
    act_valid: In(1)
    seed_valid: In(1)
    weight_valid: In(1)
    result_ready: In(1)
    out_shift: In(1)
    dout: Out(BUS)
    status: Out(6)

    def __init__(self, rows, cols, mac_stages):
        self.array = SystolicArray(rows, cols, mac_stages)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.array = array = self.array

        # Register every pin.
        pins = {}
        for name in ("din", "sel", "shift", "act_valid", "seed_valid", "weight_valid",
                     "result_ready", "out_shift"):
            pin = getattr(self, name)
            reg = Signal(len(pin), name=f"{name}_q")
            m.d.sync += reg.eq(pin)
            pins[name] = reg

        # Input shift registers, loaded 16 bits per cycle.
        targets = [array.act.payload.as_value(), array.seed.payload.as_value(),
                   array.weight.payload.as_value()]
        for index, target in enumerate(targets):
            sr = Signal(_padded(len(target)), name=f"in_sr{index}")
            with m.If(pins["shift"] & (pins["sel"] == index)):
                m.d.sync += sr.eq(Cat(sr[BUS:], pins["din"]))
            m.d.comb += target.eq(sr[:len(target)])
        m.d.comb += [
            array.act.valid.eq(pins["act_valid"]),
            array.seed.valid.eq(pins["seed_valid"]),
            array.weight.valid.eq(pins["weight_valid"]),
            array.result.ready.eq(pins["result_ready"]),
        ]

        # Result capture and shift-out.
        out_sr = Signal(len(array.result.payload.as_value()))
        with m.If(array.result.valid & array.result.ready):
            m.d.sync += out_sr.eq(array.result.payload)
        with m.Elif(pins["out_shift"]):
            m.d.sync += out_sr.eq(out_sr >> BUS)
        m.d.sync += [
            self.dout.eq(out_sr[:BUS]),
            self.status.eq(Cat(array.act.ready, array.seed.ready, array.weight.ready,
                               array.result.valid, array.weights_ready, array.busy)),
        ]
        return m


def _yosys_cells(path):
    """(LUT, FF, DSP, BRAM) from a synth_ecp5 netlist, counted the way nextpnr
    does: a CCU2C carry cell fills two LUT slots."""
    design = json.loads(Path(path).read_text())
    count = collections.Counter()
    for module in design["modules"].values():
        for cell in module.get("cells", {}).values():
            count[cell["type"]] += 1
    luts = count["LUT4"] + 2 * count["CCU2C"] + 4 * count["TRELLIS_DPR16X4"]
    return luts, count["TRELLIS_FF"], count["MULT18X18D"], count["DP16KD"]


def _size(text):
    try:
        rows, cols = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must look like 4x4, not {text!r}") from None
    return rows, cols


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=_size, nargs="+", default=[(2, 2), (4, 4), (8, 8)])
    parser.add_argument("--stages", type=int, default=2, help="mac_stages of the size table")
    parser.add_argument("--sweep", type=_size, default=(2, 2),
                        help="size of the mac_stages 1/2/3 sweep (0x0 to skip)")
    parser.add_argument("--freq", type=float, default=50, help="nextpnr target MHz")
    args = parser.parse_args(argv)

    runs = [(r, c, args.stages) for r, c in args.sizes]
    if args.sweep != (0, 0):
        runs += [(*args.sweep, s) for s in (1, 2, 3) if (*args.sweep, s) not in runs]
    header = ["array", "stages", "LUT", "FF", "DSP", "BRAM", "Fmax MHz", "LUT/PE", "FF/PE",
              "DSP/PE", "wrapper FF", "time s"]
    rows_out = []
    for rows, cols, stages in runs:
        start = time.time()
        name = f"array{rows}x{cols}s{stages}"
        workdir = Path(tempfile.mkdtemp(prefix=f"mxu-synth-{name}-"))
        try:
            report = run_ecp5(ArraySynthWrapper(rows, cols, stages), name, freq_mhz=args.freq,
                              workdir=workdir)
            luts, ffs, dsps, brams = report.luts, report.ffs, report.dsps, report.brams
            fmax = f"{report.fmax_mhz:.1f}"
        except RuntimeError:
            # nextpnr refuses a design larger than the device: report Yosys's cells.
            if not (workdir / "top.json").exists():
                raise
            luts, ffs, dsps, brams = _yosys_cells(workdir / "top.json")
            fmax = f"no fit ({DEVICE})"
        pes = rows * cols
        rows_out.append([f"{rows}x{cols}", stages, luts, ffs, dsps, brams, fmax,
                         f"{luts / pes:.0f}", f"{(ffs - wrapper_ffs(rows, cols)) / pes:.0f}",
                         f"{dsps / pes:.2f}", wrapper_ffs(rows, cols),
                         f"{time.time() - start:.0f}"])
        print(format_table(header, rows_out[-1:]) if len(rows_out) == 1 else "  ".join(
            map(str, rows_out[-1])), file=sys.stderr, flush=True)
    print(format_table(header, rows_out))
    print("FF/PE excludes the wrapper's registers; LUT/PE includes the array's skew, "
          "de-skew, weight queue and control, shared over the PEs.")
    print(f"{DEVICE} capacity: {CAPACITY['LUT']} LUT4, {CAPACITY['FF']} FF, "
          f"{CAPACITY['DSP']} MULT18X18D. 'no fit' rows: Yosys cell counts, no place-and-route.")


if __name__ == "__main__":
    main()
