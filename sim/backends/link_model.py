"""The inter-chip link model inside the Verilated chip (native builds of chips
with links, docs/pod.md): a module whose ``always @(posedge clk)`` makes one
DPI call, ``mxu_link_step``, into the harness's `LinkModel`
(``sim/backends/csrc/chip_harness.cpp``), which holds each link's flits and
credits in flight, stamped with their cycles, for the pod to carry between
chips.

At the edge that ends cycle ``n`` the call sees the chip's link outputs of
cycle ``n`` (a flit taken when ``tx_valid`` and the ``tx_ready`` the model
gave; a credit returned) and computes the inputs of cycle ``n + 1``: the flit
and the credit due then, and ``tx_ready`` from the link's bandwidth. Vectors,
least significant first: the chip's outputs are every link's ``tx_payload``,
then the ``tx_valid`` bits, then the ``rx_credit`` bits; the model's are every
link's ``rx_flit``, then the ``rx_valid``, ``tx_ready`` and ``tx_credit`` bits.
"""

import functools

from .axi_memory import dpi_step_module

__all__ = ["CHIP_OUTPUTS", "MODEL_OUTPUTS", "link_model_verilog", "link_model_ports"]

# Per-link members of `mxu.hdl.link.link_signature`, flattened as Amaranth
# names the top's ports (``links__<i>__<member>``); the wide one first.
CHIP_OUTPUTS = ("tx__payload", "tx__valid", "rx_credit")
MODEL_OUTPUTS = ("rx_flit", "rx_valid", "tx__ready", "tx_credit")


def _port(link, member):
    return f"l{link}_{member.replace('__', '_')}"


@functools.lru_cache(maxsize=None)
def link_model_verilog(links, flit_bits):
    """(module name, Verilog) of the model of `links` links of `flit_bits`-bit
    flits; its ports are named by `_port` (``l<i>_<member>``)."""
    name = f"mxu_link_model_n{links}_f{flit_bits}"
    width = {"tx__payload": flit_bits, "rx_flit": flit_bits}

    def group(members):
        return [(_port(i, mb), width.get(mb, 1)) for mb in members for i in range(links)]
    return name, dpi_step_module(name, "mxu_link_step", group(CHIP_OUTPUTS),
                                 group(MODEL_OUTPUTS),
                                 [("links", links), ("flit_bits", flit_bits)])


def link_model_ports(links):
    """{model port name: (link, member path)} for connecting the model."""
    return {_port(i, mb): (i, mb) for mb in CHIP_OUTPUTS + MODEL_OUTPUTS for i in range(links)}
