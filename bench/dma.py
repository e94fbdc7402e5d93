"""DMA throughput: sustained bytes/cycle of long loads and stores as a fraction
of the AXI bus peak (``config.axi_data_bytes`` per cycle).

Runs the Verilated DMA subsystem (DMA + VMEM + accumulator memory) next to the
C++ AXI memory model (``sim/backends/csrc/axi_mem.h``) through ``mxu.sim.backends.dma.NativeDma``;
cycles are counted from the descriptor's issue to its completion, so the
descriptor checks, the first burst's latency and the final write response are
all included. Every transfer is also checked byte for byte against
``mxu.verif.dma_model``.

    .venv/bin/python bench/dma.py                      # default chip, no back-pressure
    .venv/bin/python bench/dma.py --latency 32 --pause 0
    .venv/bin/python bench/dma.py --preset fpga
"""

import argparse
import sys
import time

import numpy as np

from mxu.hdl.config import ChipConfig
from mxu.hdl.dma import DmaDir, DmaError, DmaSpace
from mxu.sim.backends.dma import NativeDma
from mxu.sim.report import Results
from mxu.verif.dma_model import Descriptor, DmaModel

KIB = 1024


def cases(config, sizes):
    """(name, descriptor, size) for every measured transfer."""
    vrb, arb = config.vmem_row_bytes, config.acc_row_bytes
    out = []
    for size in sizes:
        out += [(name, d, size) for name, d in [
            ("load ext->VMEM contiguous", Descriptor(DmaDir.LOAD, DmaSpace.VMEM, 0x1000,
                                                    size // vrb, vrb, vrb)),
            ("load ext->VMEM base+2 (unaligned)", Descriptor(DmaDir.LOAD, DmaSpace.VMEM, 0x1002,
                                                            size // vrb, vrb, vrb)),
            ("load ext->VMEM stride 2 rows", Descriptor(DmaDir.LOAD, DmaSpace.VMEM, 0x1000,
                                                       size // vrb, vrb, 2 * vrb)),
            ("store VMEM->ext contiguous", Descriptor(DmaDir.STORE, DmaSpace.VMEM, 0x1000,
                                                     size // vrb, vrb, vrb)),
            ("store VMEM->ext base+2 (unaligned)", Descriptor(DmaDir.STORE, DmaSpace.VMEM,
                                                             0x1002, size // vrb, vrb, vrb)),
            ("store ACC->ext fp32", Descriptor(DmaDir.STORE, DmaSpace.ACC, 0x1000,
                                              size // arb, arb, arb)),
            ("store ACC->ext bf16+ReLU", Descriptor(DmaDir.STORE, DmaSpace.ACC, 0x1000,
                                                   size // (arb // 2), arb // 2, arb // 2,
                                                   to_bf16=True, relu=True)),
        ]]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="default", help="ChipConfig preset (default: default)")
    ap.add_argument("--sizes", default="64,256,512", help="transfer sizes in KiB (default 64,256,512)")
    ap.add_argument("--latency", type=int, default=0, help="memory latency per burst, cycles")
    ap.add_argument("--pause", type=int, default=0, help="%% of cycles each AXI channel pauses")
    ap.add_argument("--outstanding", type=int, default=None,
                    help="override ChipConfig.dma_max_outstanding")
    args = ap.parse_args(argv)
    config = ChipConfig.preset(args.preset)
    if args.outstanding:
        config = config.replace(dma_max_outstanding=args.outstanding)
    sizes = [int(s) * KIB for s in args.sizes.split(",")]
    t0 = time.time()
    dut = NativeDma(config, latency=(args.latency, args.latency), pause=args.pause,
                    max_reads=64, max_writes=64)
    build = time.time() - t0
    rng = np.random.default_rng(1)
    peak = config.axi_data_bytes
    rows = []
    model = DmaModel(config, ext_bytes=dut.ext_bytes)
    acc = rng.integers(0, 256, model.acc.shape, dtype=np.uint8)
    dut.write_acc(0, acc)
    model.acc[:] = acc
    for name, d, size in cases(config, sizes):
        chip_rows = config.vmem_rows if d.space == DmaSpace.VMEM else config.acc_rows
        if d.rows > chip_rows:
            continue
        if d.dir == DmaDir.LOAD:
            fill = rng.integers(0, 256, 4 * size + 0x2000, dtype=np.uint8)
            dut.ext[:fill.size] = fill
            model.ext[:fill.size] = fill
        t = time.time()
        (result,), cycles = dut.run([d])
        wall = time.time() - t
        expect = model.execute(d)
        if result[0] != expect or expect != DmaError.OK:
            sys.exit(f"{name}: completion {result[0]!r}, expected {expect!r}")
        if d.dir == DmaDir.LOAD:
            got = dut.read_rows("vmem", d.chip_row, d.rows)
            ok = np.array_equal(got, model.vmem[d.chip_row:d.chip_row + d.rows])
        else:
            end = d.ext_base + (d.rows - 1) * d.ext_stride + d.row_bytes
            ok = np.array_equal(dut.ext[:end + 64], model.ext[:end + 64])
        if not ok:
            sys.exit(f"{name}: data mismatch")
        moved = d.rows * d.row_bytes
        rows.append((name, f"{size // KIB} KiB", f"{cycles}", f"{moved / cycles:.2f}",
                     f"{100 * moved / cycles / peak:.1f} %", f"{cycles / wall / 1e6:.2f}"))
    stats = dut.stats()
    if stats["violations"]:
        sys.exit(f"AXI protocol violation: {stats['first_violation']}")
    results = Results("dma", argv=None if argv is None else [sys.argv[0], *argv])
    results.table(f"DMA throughput, preset {args.preset!r}: {config.axi_data_bits}-bit AXI "
                  f"(peak {peak} B/cycle), bursts <= {config.dma_max_burst_beats} beats, "
                  f"{config.dma_max_outstanding} outstanding, memory latency {args.latency} "
                  f"cycles, pause {args.pause} %  (build/load {build:.1f} s)",
                  ("transfer", "size", "cycles", "B/cycle", "of peak", "Mcycle/s"), rows)
    results.write()


if __name__ == "__main__":
    main()
