"""Black-box instances: a unit generated once as a named Verilog module and
instantiated by name, so that a hierarchical synthesis handles one copy (the
PE in the array, the VPU's fp32 units and lanes; docs/synth.md)."""

from amaranth.hdl import ClockSignal, Instance, ResetSignal, Value
from amaranth.lib.wiring import In

__all__ = ["black_box", "check_module_name", "signature_of"]


def black_box(m, name, module, signature, *, clocked):
    """Add to `m` a submodule `name`: an instance of the Verilog `module` whose
    ports are those of `signature` (Amaranth's names: path elements joined by
    ``__``), plus ``clk`` and ``rst`` if `clocked`. Returns an interface object
    of `signature` bound to those ports."""
    iface = signature.create(path=(name,))
    ports = {"i_clk": ClockSignal(), "i_rst": ResetSignal()} if clocked else {}
    for path, member, value in signature.flatten(iface):
        ports[("i_" if member.flow == In else "o_") + "__".join(map(str, path))] = Value.cast(value)
    m.submodules[name] = Instance(module, **ports)
    return iface


def check_module_name(name, what):
    """Raise unless `name` (the parameter `what`) is None or a Verilog module name."""
    if name is not None and (not isinstance(name, str) or not name.isidentifier()):
        raise ValueError(f"{what} must be a Verilog module name, not {name!r}")


_SIGNATURES = {}


def signature_of(cls):
    """The signature of component class `cls` (from one instance that is never
    elaborated, and says so)."""
    if cls not in _SIGNATURES:
        unit = cls()
        unit._MustUse__silence = True
        _SIGNATURES[cls] = unit.signature
    return _SIGNATURES[cls]
