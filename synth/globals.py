"""The ECP5 flow's promotion of high-fanout flip-flop controls to the global
network (docs/synth.md, "Controls on the global network").

nextpnr-ecp5 promotes clock nets only. A chip's pipeline enable and its
resets reach tens of thousands of flip-flop CE and LSR pins; in general
routing they take the wires that the datapath needs. The ECP5's global
network reaches a slice's CE and LSR: a ``DCCA`` buffer in front of such a
net makes nextpnr route it there (its ``route_globals`` gives a ``DCCA``
whose users are not clock pins one of the globals 0-7).

`promote_controls` edits Yosys's JSON netlist between ``synth_ecp5`` and
nextpnr: for each of the nets with the most CE and LSR pins of
``TRELLIS_FF`` cells (at least `min_sinks`, at most `MAX_PROMOTED`), a
``DCCA`` drives those pins; the net's other users keep the net.
"""

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PromotedNet", "promote_controls", "MAX_PROMOTED"]

# nextpnr routes a DCCA that drives logic pins on globals 0-7 only, and the
# clock may take one of them.
MAX_PROMOTED = 6
_CONTROL_PINS = ("CE", "LSR")


@dataclass(frozen=True)
class PromotedNet:
    """A net put on the global network: its name in Yosys's netlist and the
    flip-flop control pins it drives there."""
    name: str
    sinks: int


def _control_sinks(cells):
    """{bit: [(cell, pin)]}: the CE and LSR pins of the flip-flops on each net."""
    sinks = {}
    for cell in cells.values():
        if cell["type"] != "TRELLIS_FF":
            continue
        for pin in _CONTROL_PINS:
            for bit in cell["connections"].get(pin, ()):
                if isinstance(bit, int):
                    sinks.setdefault(bit, []).append((cell, pin))
    return sinks


def _net_names(netnames):
    """{bit: the shortest name of a net with that bit, a visible name before a hidden one}."""
    names = {}
    for name, net in netnames.items():
        key = (net.get("hide_name", 0), len(name))
        for bit in net["bits"]:
            if isinstance(bit, int) and (bit not in names or key < names[bit][0]):
                names[bit] = (key, name)
    return {bit: name for bit, (_, name) in names.items()}


def _next_bit(module):
    bits = [b for net in module["netnames"].values() for b in net["bits"] if isinstance(b, int)]
    return max(bits, default=1) + 1


def promote_controls(path, *, min_sinks, top="top"):
    """Put the flip-flop control nets of netlist `path` (Yosys JSON, edited in
    place) that reach at least `min_sinks` CE or LSR pins behind a ``DCCA``
    each, the nets with the most such pins first, at most `MAX_PROMOTED`;
    `min_sinks` 0 promotes none. A list of `PromotedNet`, in that order."""
    if min_sinks < 0:
        raise ValueError(f"min_sinks must be 0 (none) or positive, not {min_sinks!r}")
    if not min_sinks:
        return []
    path = Path(path)
    netlist = json.loads(path.read_text())
    module = netlist["modules"][top]
    sinks = _control_sinks(module["cells"])
    chosen = sorted((bit for bit, pins in sinks.items() if len(pins) >= min_sinks),
                    key=lambda bit: -len(sinks[bit]))[:MAX_PROMOTED]
    if not chosen:
        return []
    names = _net_names(module["netnames"])
    bit = _next_bit(module)
    promoted = []
    for net in chosen:
        name = names.get(net, f"bit{net}")
        module["cells"][f"$mxu_global${name}"] = {
            "hide_name": 0, "type": "DCCA", "parameters": {}, "attributes": {},
            "port_directions": {"CLKI": "input", "CE": "input", "CLKO": "output"},
            "connections": {"CLKI": [net], "CE": ["1"], "CLKO": [bit]},
        }
        module["netnames"][f"{name}$global"] = {"hide_name": 0, "bits": [bit], "attributes": {}}
        for cell, pin in sinks[net]:
            cell["connections"][pin] = [bit]
        promoted.append(PromotedNet(name, len(sinks[net])))
        bit += 1
    path.write_text(json.dumps(netlist))
    return promoted
