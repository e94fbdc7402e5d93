"""`MxuChip`: the whole chip (docs/architecture.md).

Inside: instruction fetch, the controller (decode, queues, tokens, status,
counters), three engines -- load (a `Dma` for LOADs), compute (`ComputeEngine`
on the `SystolicArray`), store (a second `Dma` for STOREs) -- and with
``config.vpu`` a fourth, vector (`VectorUnit`), the VMEM, the accumulator
memory and the host register file. Outside: one AXI4 master to
external memory, one AXI4-Lite slave for the host, and ``irq`` (= done).

The load DMA uses AR/R with ID 0, the fetch unit AR/R with ID 1, and the store
DMA AW/W/B, so loads and stores use the bus's two directions at the same time.
"""

from amaranth.hdl import (Cat, ClockDomain, ClockSignal, DomainRenamer, Instance, Module, Mux,
                          ResetInserter, ResetSignal, Signal)
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .accmem import AccMem
from .axi import AXI4LiteSignature, AXI4Signature
from .compute import ComputeEngine
from .controller import Controller
from .dma import Dma, DmaDir
from .fetch import FETCH_AXI_ID, FetchedInstr, InstructionFetch
from .hooks import BuildHooks
from .isa import ErrorCode
from .link import LinkBridge, LinkPort, link_signature
from .loop import LoopExpander
from .regs import BUS_USERS, COUNTERS, HOST_ADDR_BITS, RegisterFile
from .slice import RegisterSlice
from .trace import ChipTrace
from .transfer import TransferEngine
from .vmem import Vmem
from .vpu import VectorUnit

__all__ = ["MxuChip", "gate_port_members"]

_READ_FORWARD = ("arid", "araddr", "arlen", "arsize", "arburst", "arlock", "arcache", "arprot")
_WRITE_FORWARD = ("awid", "awaddr", "awlen", "awsize", "awburst", "awlock", "awcache", "awprot",
                  "awvalid", "wdata", "wstrb", "wlast", "wvalid", "bready")


def gate_port_members(config):
    """The ports of `MxuChip` with ``BuildHooks(gate_ports=True)``: per gated
    engine (the store engine, and the vector unit with ``config.vpu``) its
    clock in and its enable out."""
    members = {}
    for engine in ("store", "vector") if config.vpu else ("store",):
        members[f"gate_{engine}_clk"] = In(1)
        members[f"gate_{engine}_awake"] = Out(1)
    return members


class _ChipCore(wiring.Component):
    """Everything that a soft reset clears: all but the register file."""

    def __init__(self, config, trace, hooks):
        self.config = config
        self.trace_port = trace
        self.hooks = hooks
        super().__init__({
            "axi": Out(AXI4Signature(addr_width=config.axi_addr_bits,
                                     data_width=config.axi_data_bits)),
            "start": In(1), "clear": In(1), "prog_base": In(32), "prog_len": In(32),
            # A soft reset's drain: no new AXI burst; which users still have one in flight.
            "drain": In(1), "bus_busy": Out(len(BUS_USERS)),
            "status": Out(data.ArrayLayout(64, len(COUNTERS))),
            "busy": Out(1), "done": Out(1), "error": Out(ErrorCode), "error_pc": Out(32),
            **({"trace_events": Out(ChipTrace)} if trace else {}),
            **self._link_members(config),
            **(gate_port_members(config) if hooks.gate_ports else {}),
        })

    @staticmethod
    def _link_members(config):
        if not config.links:
            return {}
        flit = stream.Signature(8 * config.link_flit_bytes)
        return {"link_send": Out(flit).array(config.links),
                "link_receive": In(flit).array(config.links)}

    def _add_units(self, m, name, units, engine):
        """`units` (name: (component, whether a start resets it)) as
        submodules. With a clock gate, each in a clock domain of its own (named
        after it, its reset the sync one with start if so) on one gated clock
        that ticks only in cycles where they may change: `engine` is not
        idle, is offered a command, or they are reset (docs/simulation.md,
        "Idle gating")."""
        hooks = self.hooks
        if not hooks.gated:
            for unit_name, (unit, on_start) in units.items():
                m.submodules[unit_name] = ResetInserter(self.start)(unit) if on_start else unit
            return
        reset = ResetSignal("sync") | self.clear
        awake = Signal(name=f"{name}_awake")
        gclk = Signal(name=f"{name}_gclk")
        m.d.comb += awake.eq(~engine.idle | engine.cmd.valid | reset | self.start)
        if hooks.gate_ports:
            m.d.comb += [getattr(self, f"gate_{name}_awake").eq(awake),
                         gclk.eq(getattr(self, f"gate_{name}_clk"))]
        else:
            m.submodules[f"{name}_gate"] = Instance(hooks.clock_gate, i_clk=ClockSignal("sync"),
                                                    i_en=awake, o_gclk=gclk)
        for unit_name, (unit, on_start) in units.items():
            m.domains += ClockDomain(unit_name, local=True)
            m.d.comb += [ClockSignal(unit_name).eq(gclk),
                         ResetSignal(unit_name).eq(reset | self.start if on_start else reset)]
            m.submodules[unit_name] = DomainRenamer(unit_name)(unit)

    def elaborate(self, platform):
        m = Module()
        c = self.config
        m.submodules.fetch = fetch = InstructionFetch(c)
        # Two expanders in a row: LOOPs nest two deep (the outer one's body holds
        # the inner LOOP and its pairs as plain words). A start abandons a loop
        # that a failed run left half issued.
        outer, inner = LoopExpander(c), LoopExpander(c)
        m.submodules.outer_loops = ResetInserter(self.start)(outer)
        m.submodules.inner_loops = ResetInserter(self.start)(inner)
        m.submodules.ctrl = ctrl = Controller(c, trace=self.trace_port)
        m.submodules.vmem = vmem = Vmem(c, weight_port=True)
        m.submodules.acc = acc = AccMem(c)
        # The compute engine runs in its own clock domain (same clock) whose reset
        # also fires on start and on soft reset: a start drops a weight tile the
        # previous program staged but never used and clears the active weights
        # (every program begins with zero weights), and the reset reaches PEs
        # that are black-box instances, which a ResetInserter would not.
        m.domains.compute = ClockDomain("compute", local=True)
        m.d.comb += [ClockSignal("compute").eq(ClockSignal("sync")),
                     ResetSignal("compute").eq(ResetSignal("sync") | self.start | self.clear)]
        compute = ComputeEngine(c, hooks=self.hooks)
        m.submodules.compute = DomainRenamer("compute")(compute)
        m.submodules.load_dma = load_dma = Dma(c)
        store_dma = Dma(c)
        # A start clears an engine's sticky error from a run that failed.
        load = TransferEngine(c, DmaDir.LOAD)
        store = TransferEngine(c, DmaDir.STORE)
        m.submodules.load = ResetInserter(self.start)(load)
        # The store DMA answers to the store engine only: they are idle
        # together. (The load engine is busy for most of a model's run.)
        self._add_units(m, "store", {"store": (store, True), "store_dma": (store_dma, False)},
                        store)

        m.d.comb += [
            fetch.start.eq(self.start), fetch.base.eq(self.prog_base),
            fetch.length.eq(self.prog_len), fetch.stop.eq(ctrl.fetch_stop | self.drain),
            ctrl.start.eq(self.start),
            ctrl.fetch_error.eq(fetch.error), ctrl.fetch_error_pc.eq(fetch.error_pc),
            ctrl.fetch_busy.eq(fetch.busy),
        ]
        # Register slices around the expanders: their LOOP legality checks and
        # body memories would otherwise chain, through the valid/ready
        # handshakes, into the fetch queue and into the decoder (docs/synth.md,
        # "Pipelining the control for 50 MHz").
        for name, source, sink in (("fetch_slice", fetch.instr, outer.i),
                                   ("loop_slice", outer.o, inner.i),
                                   ("decode_slice", inner.o, ctrl.instr)):
            m.submodules[name] = stage = ResetInserter(self.start)(RegisterSlice(FetchedInstr))
            wiring.connect(m, source, stage.i)
            wiring.connect(m, stage.o, sink)
        # The expanders' LOOP legality reads the program's length: latched at
        # start, so that a host write to PROG_LEN during a run cannot turn an
        # instruction already offered into a LOOP (docs/formal.md).
        run_length = Signal(32)
        with m.If(self.start):
            m.d.sync += run_length.eq(self.prog_len)
        m.d.comb += [outer.length.eq(run_length), inner.length.eq(run_length)]
        engines = [("load", load), ("compute", compute), ("store", store)]
        if c.vpu:
            vector = VectorUnit(c, hooks=self.hooks)
            self._add_units(m, "vector", {"vector": (vector, True)}, vector)
            engines.append(("vector", vector))
            wiring.connect(m, vector.read_a, acc.vector_read_a)
            wiring.connect(m, vector.read_b, acc.vector_read_b)
            wiring.connect(m, vector.acc_write, acc.vector_write)
            wiring.connect(m, vector.vmem_write, vmem.vector_write)
            m.d.comb += ctrl.vector_accept.eq(vector.active)
        for name, engine in engines:
            wiring.connect(m, getattr(ctrl, f"{name}_cmd"), engine.cmd)
            wiring.connect(m, engine.complete, getattr(ctrl, f"{name}_complete"))
            m.d.comb += [getattr(ctrl, f"{name}_error").eq(engine.error),
                         getattr(ctrl, f"{name}_idle").eq(engine.idle)]
        m.d.comb += [load_dma.drain.eq(self.drain), store_dma.drain.eq(self.drain),
                     # (In BUS_USERS order.)
                     self.bus_busy.eq(Cat(fetch.busy, ~load_dma.quiet, ~store_dma.quiet))]
        wiring.connect(m, load.dma_cmd, load_dma.cmd)
        wiring.connect(m, load_dma.done, load.dma_done)
        wiring.connect(m, store.dma_cmd, store_dma.cmd)
        wiring.connect(m, store_dma.done, store.dma_done)

        # On-chip memories: the compute engine's ports, the load DMA's writes and
        # the store DMA's reads. The unused DMA ports stay unconnected (idle).
        wiring.connect(m, compute.act_read, vmem.array_read)
        for name in compute.weight_reads:
            wiring.connect(m, getattr(compute, name), getattr(vmem, name))
        wiring.connect(m, compute.seed_read, acc.array_read)
        wiring.connect(m, compute.result_write, acc.array_write)
        for port, lane in zip(load_dma.vmem_writes, vmem.dma_writes):
            wiring.connect(m, getattr(load_dma, port), getattr(vmem, lane))
        wiring.connect(m, load_dma.acc_write, acc.dma_write)
        wiring.connect(m, store_dma.vmem_read, vmem.dma_read)
        wiring.connect(m, store_dma.acc_read, acc.dma_read)
        for port in (load_dma.vmem_read, load_dma.acc_read):
            m.d.comb += port.req.ready.eq(0)
        for port in (*(getattr(store_dma, n) for n in store_dma.vmem_writes), store_dma.acc_write):
            m.d.comb += port.ready.eq(0)

        load_axi, store_axi = load_dma.axi, store_dma.axi
        if c.links:
            m.submodules.links = bridge = LinkBridge(c)
            wiring.connect(m, load_dma.axi, bridge.load)
            wiring.connect(m, store_dma.axi, bridge.store)
            for i in range(c.links):
                wiring.connect(m, bridge.send[i], wiring.flipped(self.link_send[i]))
                wiring.connect(m, wiring.flipped(self.link_receive[i]), bridge.receive[i])
            load_axi, store_axi = bridge.load_mem, bridge.store_mem
        self._axi(m, fetch, load_axi, store_axi)
        m.d.comb += [
            ctrl.array_accept.eq(compute.array_accept),
            ctrl.dma_read_beat.eq(load_dma.axi.rvalid & load_dma.axi.rready),
            ctrl.dma_write_beat.eq(store_dma.axi.wvalid & store_dma.axi.wready),
            self.status.eq(ctrl.counters),
            self.busy.eq(ctrl.busy), self.done.eq(ctrl.done),
            self.error.eq(ctrl.error), self.error_pc.eq(ctrl.error_pc),
        ]
        if self.trace_port:
            m.d.comb += [
                self.trace_events.load.eq(ctrl.engine_trace[0]),
                self.trace_events.compute.eq(ctrl.engine_trace[1]),
                self.trace_events.store.eq(ctrl.engine_trace[2]),
                self.trace_events.vector.eq(ctrl.engine_trace[3]),
                self.trace_events.loadw_done.eq(compute.loadw_done),
                self.trace_events.array_accept.eq(compute.array_accept),
                self.trace_events.running.eq(ctrl.busy),
            ]
        return m

    def _axi(self, m, fetch, load_axi, store_axi):
        """AR: fetch and load DMA share it (held until accepted); R goes back by ID.
        While the fetch is hungry (its queue at most half full) the load DMA
        starts no new burst: its bursts in flight still come first, then the
        fetch's follow each other. AW/W/B belong to the store DMA alone."""
        bus = self.axi
        locked = Signal()
        owner = Signal()            # 1: fetch owns AR
        pick = Mux(locked, owner, fetch.axi.arvalid)
        # A burst already offered is held until accepted (AXI): only a new one waits.
        load_valid = load_axi.arvalid & (locked | ~fetch.hungry)
        with m.If(bus.arvalid & ~bus.arready):
            m.d.sync += [locked.eq(1), owner.eq(pick)]
        with m.Else():
            m.d.sync += locked.eq(0)
        for name in _READ_FORWARD:
            src = Mux(pick, getattr(fetch.axi, name), getattr(load_axi, name))
            m.d.comb += getattr(bus, name).eq(src)
        m.d.comb += [
            bus.arid.eq(Mux(pick, FETCH_AXI_ID, 0)),
            bus.arvalid.eq(Mux(pick, fetch.axi.arvalid, load_valid)),
            fetch.axi.arready.eq(pick & bus.arready),
            load_axi.arready.eq(~pick & bus.arready & load_valid),
        ]
        # Qualified by RVALID: RID is undefined (X in simulation) between bursts.
        to_fetch = bus.rvalid & (bus.rid == FETCH_AXI_ID)
        for dst, mine in ((fetch.axi, to_fetch), (load_axi, ~to_fetch)):
            m.d.comb += [dst.rid.eq(0), dst.rdata.eq(bus.rdata), dst.rresp.eq(bus.rresp),
                         dst.rlast.eq(bus.rlast), dst.rvalid.eq(bus.rvalid & mine)]
        m.d.comb += bus.rready.eq(Mux(to_fetch, fetch.axi.rready, load_axi.rready))
        for name in _WRITE_FORWARD:
            if name.startswith("b"):
                m.d.comb += bus.bready.eq(store_axi.bready)
            else:
                m.d.comb += getattr(bus, name).eq(getattr(store_axi, name))
        m.d.comb += [
            store_axi.awready.eq(bus.awready), store_axi.wready.eq(bus.wready),
            store_axi.bid.eq(bus.bid), store_axi.bresp.eq(bus.bresp),
            store_axi.bvalid.eq(bus.bvalid),
        ]


class MxuChip(wiring.Component):
    """The mxu chip.

    Parameters
    ----------
    config : ChipConfig
    trace : bool
        Adds the ``trace_events`` port. Not a build hook: it changes the
        chip's interface and its controller's logic, for the profiler.
    hooks : BuildHooks or None
        Units replaced by named Verilog modules, idle clock gating (with
        ``gate_ports``, the ``gate_<e>_clk``/``gate_<e>_awake`` ports of
        `gate_port_members`): the same bits and cycles (`BuildHooks`).
        None: none.

    Interface
    ---------
    axi : Out(AXI4Signature(config.axi_addr_bits, config.axi_data_bits))
        Master port to external memory (program, operands, results).
    host : In(AXI4LiteSignature(addr_width=12, data_width=32))
        The register file (`mxu.hdl.regs`).
    irq : Out(1)
        High once a run has finished (``STATUS.done``), until the next start.
    links : Out(link_signature(config)).array(config.links), with ``config.links`` only
        The inter-chip links (`mxu.hdl.link`, docs/pod.md).
    trace_events : Out(ChipTrace), with ``trace=True`` only
        What each engine starts and completes, token waits, array activity
        (`mxu.hdl.trace`): for the profiler of simulation builds.
    """

    def __init__(self, config, *, trace=False, hooks=None):
        from .config import ChipConfig
        if not isinstance(config, ChipConfig):
            raise TypeError(f"MxuChip needs a ChipConfig, not {type(config).__name__}")
        hooks = BuildHooks() if hooks is None else hooks
        if not isinstance(hooks, BuildHooks):
            raise TypeError(f"MxuChip's hooks must be a BuildHooks, not {type(hooks).__name__}")
        self.config = config
        self.trace_port = trace
        self.hooks = hooks
        super().__init__({
            "axi": Out(AXI4Signature(addr_width=config.axi_addr_bits,
                                     data_width=config.axi_data_bits)),
            "host": In(AXI4LiteSignature(addr_width=HOST_ADDR_BITS, data_width=32)),
            "irq": Out(1),
            **({"trace_events": Out(ChipTrace)} if trace else {}),
            **({"links": Out(link_signature(config)).array(config.links)} if config.links else {}),
            **(gate_port_members(config) if hooks.gate_ports else {}),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.regs = regs = RegisterFile(self.config)
        core = _ChipCore(self.config, self.trace_port, self.hooks)
        # A soft reset drains the core's AXI bursts first (`SoftReset`).
        m.submodules.core = ResetInserter(regs.soft_reset)(core)
        wiring.connect(m, wiring.flipped(self.host), regs.bus)
        wiring.connect(m, core.axi, wiring.flipped(self.axi))
        m.d.comb += [
            core.start.eq(regs.start), core.clear.eq(regs.soft_reset),
            core.drain.eq(regs.draining), regs.bus_busy.eq(core.bus_busy),
            core.prog_base.eq(regs.prog_base),
            core.prog_len.eq(regs.prog_len),
            regs.busy.eq(core.busy), regs.done.eq(core.done), regs.error.eq(core.error),
            regs.error_pc.eq(core.error_pc), regs.counters.eq(core.status),
            self.irq.eq(core.done),
        ]
        if self.trace_port:
            m.d.comb += self.trace_events.eq(core.trace_events)
        gate_ports = gate_port_members(self.config) if self.hooks.gate_ports else {}
        for port, member in gate_ports.items():
            inner, outer = getattr(core, port), getattr(self, port)
            m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)
        # Outside the core: a soft reset leaves the links' credits and buffers
        # alone (`LinkPort`).
        for i in range(self.config.links):
            m.submodules[f"link{i}"] = port = LinkPort(self.config)
            wiring.connect(m, core.link_send[i], port.send)
            wiring.connect(m, port.receive, core.link_receive[i])
            wiring.connect(m, port.link, wiring.flipped(self.links[i]))
        return m
