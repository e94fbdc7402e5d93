"""`ChipConfig`: the single source of truth for every size in mxu.

The HDL, the golden model, the simulation drivers, the benches and the synthesis
flows all take a `ChipConfig`; none of them copies one of its numbers.
"""

import numbers
from dataclasses import dataclass, fields, replace

from .mac import MAC_STAGES
from .numerics import FP_STAGES
from .quant import QUANT_FORMATS, QUANT_INFO, QuantFormat, sections_fit_beats, tile_block_bytes

__all__ = ["ChipConfig", "MeasuredFmax", "MEASURED_FMAX_MHZ"]


@dataclass(frozen=True)
class MeasuredFmax:
    """The Fmax of one place-and-route run of a preset's whole chip on the
    LFE5U-85F: `mhz`, the `commit` it ran at and nextpnr's `seed`."""
    mhz: float
    commit: str
    seed: int

    def __str__(self):
        return f"{self.mhz} MHz (commit {self.commit}, seed {self.seed})"


# Fmax by preset, only for presets whose whole chip was placed and routed
# (docs/synth.md has the runs): what cycle counts are turned into seconds with
# (`mxu generate`'s tokens/s). A preset missing here was never routed; its
# cycles are not turned into seconds.
# (fpga-llm: `mxu synth --preset fpga-llm --target ecp5 --seed 1` at b3353d7,
# with its enable and resets on the global network; seed 4 routes at 53.30.)
MEASURED_FMAX_MHZ = {"fpga": MeasuredFmax(55.91, commit="00b4d5c", seed=2),
                     "fpga-llm": MeasuredFmax(53.13, commit="b3353d7", seed=1)}


def _is_pow2(n):
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class ChipConfig:
    """Sizes of one mxu chip.

    Parameters
    ----------
    rows, cols : int
        Systolic array height (the reduction dimension K of one weight tile) and
        width (output columns N of one tile). Any value >= 1.
    mac_stages : int
        Pipeline depth of one `MacUnit` (bf16 multiply then fp32 add): 1 to 7
        (docs/array.md: what each depth costs and the tiles it streams without a bubble).
    vmem_bytes : int
        Capacity of the bf16 scratchpad (VMEM).
    vmem_banks : int
        Number of VMEM banks (a power of two).
    acc_bytes : int
        Capacity of the fp32 accumulator memory.
    axi_data_bits : int
        Data width of the AXI4 master (64, 128, 256 or 512).
    axi_addr_bits : int
        Address width of the AXI4 master.
    ext_mem_bytes : int
        Size of the external-memory model that whole-chip simulations put next
        to the chip (a power of two).
    acc_banks : int
        Number of accumulator-memory banks (a power of two).
    dma_max_outstanding : int
        AXI bursts the DMA keeps in flight per direction (1..64).
    dma_max_burst_beats : int
        Longest AXI INCR burst the DMA issues: a power of two, 1..256 (bursts also
        never cross a 4 KiB boundary).
    cmd_queue_depth : int
        Instructions each engine's command queue holds between fetch and the
        engine (a power of two, >= 2).
    loop_body_instrs : int
        Longest body of a LOOP instruction each loop expander stores (1..4096).
    vpu_stages : int
        Pipeline stages of each fp32 unit (adder, multipliers, max, min) of
        the vector unit's lanes and reduction tree: 1 to 5 (docs/vpu.md,
        "Pipeline depth": where the boundaries go). The same bits at every
        depth and a row a cycle; a deeper unit makes every lane and tree
        latency that many times longer.
    vpu : bool
        Build the vector unit (`mxu.hdl.vpu.VectorUnit`, docs/vpu.md): the
        vector engine and its VECTOR instruction. Off by default: it is 2.5
        times the rest of the 16x16 chip, in gates and in Verilator build time.
    links : int
        Inter-chip links (0 to 8; docs/pod.md): 2 for a chip in a ring, 4 in
        a 2-D torus. Each link moves one AXI data beat (`link_flit_bytes`) per
        flit, with credit flow control; SEND and RECV use them.
    link_credits : int
        Flits each link's receive buffer holds, and so the credits its
        sender starts with (a power of two, 2 to 65536). To keep a link busy
        it must cover the round trip: 2 x latency x bandwidth / flit bytes.
    weight_rows_per_cycle : int
        Weight rows the array's weight port takes per cycle (a power of two, at
        most `vmem_banks`: the rows of one beat are read from distinct VMEM
        banks in one cycle). A tile then loads in `weight_load_cycles` =
        ``ceil(rows / weight_rows_per_cycle)`` cycles; 1 is the narrow port
        (docs/array.md, section 4).
    quant_formats : tuple of str or None
        The GGUF block formats (`mxu.hdl.quant.QuantFormat` names) that the
        DMA's weight expander takes (docs/numerics.md, "Quantized weights").
        A format needs a tile-block whose header and code sections are whole
        bus beats (``cols * header_bytes`` and ``cols * block * bits / 8``
        multiples of the bus bytes). None (the default): all six if they all
        fit this chip, else none; ``()``: no expander.
    """

    rows: int = 16
    cols: int = 16
    mac_stages: int = 2
    vmem_bytes: int = 1 << 20
    vmem_banks: int = 2
    acc_bytes: int = 512 << 10
    axi_data_bits: int = 128
    axi_addr_bits: int = 32
    ext_mem_bytes: int = 64 << 20
    acc_banks: int = 2
    dma_max_outstanding: int = 16
    dma_max_burst_beats: int = 256
    cmd_queue_depth: int = 8
    loop_body_instrs: int = 255
    vpu: bool = False
    vpu_stages: int = 1
    links: int = 0
    link_credits: int = 64
    weight_rows_per_cycle: int = 2
    quant_formats: tuple | None = None

    def __post_init__(self):
        # Not a field: whether quant_formats was left to the sizes (None), so
        # that `replace` resolves it again for the new sizes.
        object.__setattr__(self, "_quant_auto", self.quant_formats is None)
        self._resolve_quant_formats()
        # NumPy integers are integers too; store them as int so that equal
        # configurations compare, hash and print equal.
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "quant_formats":
                continue
            if f.name == "vpu":
                if not isinstance(value, bool):
                    raise ValueError(f"ChipConfig.vpu must be True or False, not {value!r}")
                object.__setattr__(self, f.name, bool(value))
            elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
                object.__setattr__(self, f.name, int(value))
            else:
                kind = "a positive integer" if f.name in ("rows", "cols") else "an integer"
                raise ValueError(f"ChipConfig.{f.name} must be {kind}, not {value!r}")
        for name in ("rows", "cols"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"ChipConfig.{name} must be a positive integer, not {value!r}")
        if self.mac_stages not in MAC_STAGES:
            raise ValueError(f"ChipConfig.mac_stages must be {MAC_STAGES[0]} to {MAC_STAGES[-1]}, "
                             f"not {self.mac_stages!r}")
        if self.vpu_stages not in FP_STAGES:
            raise ValueError(f"ChipConfig.vpu_stages must be {FP_STAGES[0]} to {FP_STAGES[-1]}, "
                             f"not {self.vpu_stages!r}")
        if self.axi_data_bits not in (64, 128, 256, 512):
            raise ValueError(
                f"ChipConfig.axi_data_bits must be 64, 128, 256 or 512, not {self.axi_data_bits!r}")
        if not _is_pow2(self.vmem_banks):
            raise ValueError(f"ChipConfig.vmem_banks must be a power of two, not {self.vmem_banks!r}")
        if not _is_pow2(self.ext_mem_bytes):
            raise ValueError(
                f"ChipConfig.ext_mem_bytes must be a power of two, not {self.ext_mem_bytes!r}")
        if self.ext_mem_bytes > 1 << self.axi_addr_bits:
            raise ValueError(
                f"ChipConfig.ext_mem_bytes ({self.ext_mem_bytes}) does not fit in "
                f"{self.axi_addr_bits} address bits")
        if self.vmem_rows < 2 * self.vmem_banks:
            raise ValueError(
                f"ChipConfig.vmem_bytes ({self.vmem_bytes}) holds fewer than two rows per bank")
        if self.acc_rows < 1:
            raise ValueError(f"ChipConfig.acc_bytes ({self.acc_bytes}) holds no accumulator row")
        if not _is_pow2(self.acc_banks):
            raise ValueError(f"ChipConfig.acc_banks must be a power of two, not {self.acc_banks!r}")
        if self.acc_rows < 2 * self.acc_banks:
            raise ValueError(
                f"ChipConfig.acc_bytes ({self.acc_bytes}) holds fewer than two rows per bank")
        if not isinstance(self.dma_max_outstanding, int) or not 1 <= self.dma_max_outstanding <= 64:
            raise ValueError(
                f"ChipConfig.dma_max_outstanding must be an integer from 1 to 64, "
                f"not {self.dma_max_outstanding!r}")
        if not _is_pow2(self.dma_max_burst_beats) or self.dma_max_burst_beats > 256:
            raise ValueError(
                f"ChipConfig.dma_max_burst_beats must be a power of two from 1 to 256, "
                f"not {self.dma_max_burst_beats!r}")

        if not 1 <= self.loop_body_instrs <= 4096:
            raise ValueError(f"ChipConfig.loop_body_instrs must be from 1 to 4096, "
                             f"not {self.loop_body_instrs!r}")
        if not _is_pow2(self.cmd_queue_depth) or self.cmd_queue_depth < 2:
            raise ValueError(f"ChipConfig.cmd_queue_depth must be a power of two >= 2, "
                             f"not {self.cmd_queue_depth!r}")
        if not 0 <= self.links <= 8:
            raise ValueError(f"ChipConfig.links must be from 0 to 8, not {self.links!r}")
        if not _is_pow2(self.link_credits) or not 2 <= self.link_credits <= 1 << 16:
            raise ValueError(f"ChipConfig.link_credits must be a power of two from 2 to 65536, "
                             f"not {self.link_credits!r}")
        if not _is_pow2(self.weight_rows_per_cycle) or self.weight_rows_per_cycle > self.vmem_banks:
            raise ValueError(
                f"ChipConfig.weight_rows_per_cycle must be a power of two no larger than "
                f"vmem_banks ({self.vmem_banks}), not {self.weight_rows_per_cycle!r}")
        if self.links and self.ext_mem_bytes > self.link_window_base:
            raise ValueError(
                f"ChipConfig.ext_mem_bytes ({self.ext_mem_bytes}) overlaps the links' address "
                f"window at 0x{self.link_window_base:x}: give the chip more address bits")

    def _resolve_quant_formats(self):
        """Names in `QUANT_FORMATS` order; None -> every format that fits."""
        value, bus = self.quant_formats, self.axi_data_bits // 8
        if value is None:
            sized = isinstance(self.cols, int) and isinstance(bus, int) and self.cols >= 1
            fits = sized and all(sections_fit_beats(f, self.cols, bus)
                                 and tile_block_bytes(f, self.cols) < 1 << 12 for f in QUANT_FORMATS)
            names = tuple(f.name for f in QUANT_FORMATS) if fits else ()
        else:
            if isinstance(value, str) or not all(isinstance(v, (str, QuantFormat)) for v in value):
                raise ValueError(f"ChipConfig.quant_formats must be a tuple of format names, "
                                 f"not {value!r}")
            given = {getattr(v, "name", v) for v in value}
            known = {f.name for f in QUANT_FORMATS}
            if given - known:
                raise ValueError(f"ChipConfig.quant_formats: unknown format "
                                 f"{sorted(given - known)[0]!r}; choose from {sorted(known)}")
            names = tuple(f.name for f in QUANT_FORMATS if f.name in given)
            for name in names:
                fmt = QuantFormat[name]
                if tile_block_bytes(fmt, self.cols) >= 1 << 12:
                    raise ValueError(
                        f"ChipConfig.quant_formats: a {name} tile-block of {self.cols} columns "
                        f"({tile_block_bytes(fmt, self.cols)} bytes) does not fit the LOAD's "
                        f"12-bit row_bytes")
                if not sections_fit_beats(fmt, self.cols, bus):
                    info = QUANT_INFO[fmt]
                    raise ValueError(
                        f"ChipConfig.quant_formats: {name} needs cols * {info.header_bytes} "
                        f"header bytes ({self.cols * info.header_bytes}) and cols * "
                        f"{info.code_bytes} code bytes ({self.cols * info.code_bytes}) to be "
                        f"multiples of the bus's {bus} bytes")
        object.__setattr__(self, "quant_formats", names)

    @property
    def quant_rows(self):
        """bf16 weight rows the expander produces per cycle: the rows of 4-bit
        codes one bus beat carries (a power of two, at most 16: a group of
        rows then never straddles a sub-block), but no more than VMEM's DMA
        write lanes (`weight_rows_per_cycle`) take in a cycle."""
        n = max(1, self.axi_data_bits // (4 * self.cols))
        return min(16, 1 << (n.bit_length() - 1), self.weight_rows_per_cycle)

    # Derived sizes. Keep every derived number here so that nobody recomputes it.
    @property
    def vmem_row_elems(self):
        """bf16 elements in one VMEM row: an activation row or a weight row."""
        return max(self.rows, self.cols)

    @property
    def weight_load_cycles(self):
        """Cycles (weight-port beats) in which one weight tile enters the
        array: ``ceil(rows / weight_rows_per_cycle)``."""
        return -(-self.rows // self.weight_rows_per_cycle)

    @property
    def vmem_row_bytes(self):
        return 2 * self.vmem_row_elems

    @property
    def vmem_rows(self):
        return self.vmem_bytes // self.vmem_row_bytes

    @property
    def acc_row_bytes(self):
        return 4 * self.cols

    @property
    def acc_rows(self):
        return self.acc_bytes // self.acc_row_bytes

    @property
    def axi_data_bytes(self):
        return self.axi_data_bits // 8

    @property
    def link_flit_bytes(self):
        """Bytes of one link flit: one AXI data beat of the DMA engines."""
        return self.axi_data_bytes

    @property
    def link_window_base(self):
        """Start of the links' address window, the top half of the AXI address
        space: SEND and RECV address link ``i`` at ``link_window_base + i *
        link_window_bytes`` (docs/pod.md)."""
        return 1 << (self.axi_addr_bits - 1)

    @property
    def link_window_bytes(self):
        return 1 << (self.axi_addr_bits - 4)

    def replace(self, **changes):
        """A copy with some fields changed (validated again). Formats left to
        the sizes (``quant_formats=None``) are chosen again for the new ones."""
        if self._quant_auto and "quant_formats" not in changes:
            changes["quant_formats"] = None
        return replace(self, **changes)

    @classmethod
    def preset(cls, name):
        """A named configuration: ``"default"`` (16x16 simulation chip),
        ``"vpu"`` (the same with the vector unit and four accumulator banks,
        docs/vpu.md), ``"pod"`` (the vpu chip with a 64-byte bus, links and a
        4 MiB accumulator: a chip of a `Pod`, docs/pod.md), ``"llm"`` (the vpu chip with 1 MiB of accumulator and 1 GiB of external memory: a
        decoder LLM's weights and KV caches, docs/llm.md), ``"fpga"`` (4x4, the largest array measured whose whole
        chip places and routes on an LFE5U-85F, see docs/synth.md) or
        ``"fpga-llm"`` (8x1 with the vector unit of pipelined fp32 units and
        1 GiB of external memory: the LLM chip sized for the LFE5U-85F,
        docs/synth.md)."""
        try:
            return _PRESETS[name]
        except KeyError:
            raise ValueError(
                f"unknown ChipConfig preset {name!r}; choose one of {sorted(_PRESETS)}") from None


_PRESETS = {
    "default": ChipConfig(),
    # The vector unit reads two accumulator rows and writes one per cycle beside
    # the array's read and write: two banks (one read and one write port each)
    # would halve it while the array runs, four keep it at a row per cycle
    # (docs/vpu.md, "Fused epilogues").
    "vpu": ChipConfig(vpu=True, acc_banks=4),
    # The decoder LLM (docs/llm.md): the vpu chip with 1 GiB of external
    # memory for SmolLM2-135M's bf16 weights (269 MB) and KV caches. The bus
    # stays 128 bits: a decode step then streams its weights at the bus's
    # rate at every batch up to 32, where the array's compute meets it
    # (wider buses: docs/llm.md, "The bus"). 1 MiB of accumulator: a 64-token
    # prefill's add_rms_norm epilogues hold whole rows of 576 in one M block;
    # with 512 KiB they took two, and each weight tile was loaded twice.
    "llm": ChipConfig(vpu=True, acc_banks=4, acc_bytes=1 << 20, ext_mem_bytes=1 << 30),
    # A chip of a pod (docs/pod.md): the vpu chip with a 512-bit bus, so
    # that its DMA engines (and so a link's flits) move 64 bytes a cycle,
    # one accumulator row; 4 MiB of accumulator, for a ring all-reduce of
    # 1 MiB in place (the message, the gathered chunks and receive buffers);
    # two links (a ring) whose 1024 credits cover a round trip of 2 x 500
    # cycles at a flit a cycle.
    "pod": ChipConfig(vpu=True, acc_banks=4, acc_bytes=4 << 20, axi_data_bits=512, links=2,
                      link_credits=1024),
    # LFE5U-85F (docs/synth.md): 4x4 is the largest array whose whole chip
    # places and routes (at MEASURED_FMAX_MHZ["fpga"], 46 % of the LUT4s with
    # the weight expander); 8x8
    # places but does not route. mac_stages 7: the PE alone closes well above
    # the chip (docs/synth.md, "The timing guard"), so the chip's worst path
    # is in the control. VMEM: 8192 rows of 4 bf16; accumulator: 3072 rows
    # of 4 fp32; 77 of the 208 DP16KD block RAMs.
    # One weight row a cycle: its 64-bit bus brings a 4x4 bf16 tile in 4
    # cycles, what a narrow port takes, and a second lane's delay lines would
    # add flip-flops to a chip that fills the part (docs/array.md, section 4).
    # The weight expander with every format (quant_formats left to the sizes):
    # its 4 columns and 64-bit bus fit them all (docs/synth.md, "The weight
    # expander on the `fpga` chip").
    "fpga": ChipConfig(rows=4, cols=4, mac_stages=7, vmem_bytes=64 << 10, vmem_banks=2,
                       acc_bytes=48 << 10, axi_data_bits=64, ext_mem_bytes=1 << 20,
                       weight_rows_per_cycle=1),
    # The LLM chip for the LFE5U-85F (docs/synth.md, "The fpga-llm chip"). A
    # vector lane is 15 fp32 multipliers (4 MULT18X18D each, 60 a lane) and
    # 14 adders, about 22k LUT4: one lane is what fits beside an array, so the
    # array is one column wide (cols = lanes), and 8 rows deep: 8 PEs of 2
    # MULT18X18D. 16 rows placed at 74 % of the LUT4s and never routed; 8
    # route (61 %). A batch-4 decode step's MATMUL of 4 rows then outlasts
    # its tile's 2 beats of the 64-bit bus. The lanes' fp32 units take
    # `vpu_stages` 5 stages, for 50 MHz: at 4, the multiplier's first stage
    # (the shared unit's input select into the DSP product and its partial
    # sums) was the routed chip's worst path (docs/synth.md).
    # Four accumulator banks keep the vector unit at a row a cycle beside the
    # array (docs/vpu.md); 128 KiB of accumulator, 64 KiB of VMEM, block RAM.
    # 1 GiB of external memory, as the llm chip: SmolLM2-135M's bf16 weights
    # and KV caches (off-chip: it costs address bits only). No weight
    # expander: one column is not a whole bus beat of any format's sections.
    "fpga-llm": ChipConfig(rows=8, cols=1, mac_stages=7, vmem_bytes=64 << 10, vmem_banks=2,
                           acc_bytes=128 << 10, acc_banks=4, axi_data_bits=64,
                           ext_mem_bytes=1 << 30, vpu=True, vpu_stages=5,
                           weight_rows_per_cycle=2, quant_formats=()),
}
