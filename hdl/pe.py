"""One processing element (PE) of the weight-stationary systolic array.

The PE holds two bf16 weights: the *active* one, which multiplies every
activation that passes, and the *shadow* one, which the array loads with the next
weight tile while the active one computes. The activation enters from the west
with a one-bit *switch* marker; the marker is set on the first activation of a
new weight tile, and in that same cycle the PE multiplies by the shadow weight and
copies it into the active register. Because the marker travels with the
activation, the switch sweeps over the array as a diagonal wave, exactly one tile
boundary behind the last row of the old tile (docs/array.md).

The partial sum enters from the north, gets ``a*w`` added by a `MacPipeline`
(``mac_stages`` cycles, numerics in docs/numerics.md) and leaves to the south. The
activation leaves to the east one cycle after it arrived.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .mac import MAC_STAGES, MacPipeline
from .numerics import BF16, FP32

__all__ = ["ActivationFlow", "PsumFlow", "WeightLoad", "PE_SIGNATURE", "ProcessingElement"]


ActivationFlow = wiring.Signature({
    "data": Out(BF16),     # the bf16 activation a[i, k]
    "switch": Out(1),      # first activation of a new weight tile (never set on a bubble)
})
"""West-to-east flow: one activation and its tile-switch marker."""

PsumFlow = wiring.Signature({
    "data": Out(FP32),     # fp32 partial sum of C[i, j]
    "valid": Out(1),       # this partial sum belongs to an accepted activation row
})
"""North-to-south flow: one fp32 partial sum and its valid bit."""

WeightLoad = wiring.Signature({
    "data": Out(BF16),     # next weight of this PE
    "load": Out(1),        # write `data` into the shadow register
})
"""The shadow-weight write port of one PE."""

PE_SIGNATURE = wiring.Signature({
    "en": In(1),
    "west": In(ActivationFlow),
    "east": Out(ActivationFlow),
    "north": In(PsumFlow),
    "south": Out(PsumFlow),
    "weight": In(WeightLoad),
})
"""The ports of `ProcessingElement` (the same for every ``mac_stages``)."""


class ProcessingElement(wiring.Component):
    """A weight-stationary PE: ``south = north + west * active_weight``.

    Parameters
    ----------
    mac_stages : int
        Latency of the multiply-add, 1 to 7 (see `MacPipeline`). The partial
        sum leaves `mac_stages` cycles after it entered; the activation leaves one
        cycle after it entered.

    Interface
    ---------
    en : In(1)
        Clock enable of everything in the PE (the array's global stall).
    west : In(ActivationFlow)
        Activation and switch marker from the west neighbour (or the left edge).
    east : Out(ActivationFlow)
        The same, registered, to the east neighbour.
    north : In(PsumFlow)
        Partial sum from the north neighbour (or the column's seed).
    south : Out(PsumFlow)
        ``north.data + west.data * w`` with ``north.valid``, `mac_stages` cycles
        later; ``w`` is the shadow weight when ``west.switch`` is set, else the
        active weight.
    weight : In(WeightLoad)
        Shadow-weight write port. A load and a switch in the same cycle are
        allowed: the active register takes the old shadow value and the shadow
        register the new one.
    """

    def __init__(self, mac_stages=2):
        if mac_stages not in MAC_STAGES:
            raise ValueError(f"mac_stages must be one of {MAC_STAGES}, not {mac_stages!r}")
        self.mac_stages = mac_stages
        super().__init__(PE_SIGNATURE)

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac = mac = MacPipeline(self.mac_stages)
        self.mac = mac      # (its valid registers: the formal proofs' lemmas)

        active = Signal(BF16, name="active")
        shadow = Signal(BF16, name="shadow")
        switch = self.west.switch

        with m.If(self.en):
            m.d.sync += [
                self.east.data.eq(self.west.data),
                self.east.switch.eq(switch),
            ]
            with m.If(switch):
                m.d.sync += active.eq(shadow)
            with m.If(self.weight.load):
                m.d.sync += shadow.eq(self.weight.data)

        m.d.comb += [
            mac.en.eq(self.en),
            mac.operands.a.eq(self.west.data),
            mac.operands.w.eq(Mux(switch, shadow.as_value(), active.as_value())),
            mac.operands.acc.eq(self.north.data),
            mac.valid.eq(self.north.valid),
            self.south.data.eq(mac.result),
            self.south.valid.eq(mac.result_valid),
        ]
        return m
