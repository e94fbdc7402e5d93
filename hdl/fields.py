"""Packing Python values into `data.StructLayout` bit patterns and back: the one
place where the assembler, the DMA models and the testbenches turn field dicts
into the integers the hardware sees."""

from amaranth.lib import data

__all__ = ["pack_fields", "unpack_fields", "struct_layout"]


def struct_layout(shape):
    """The StructLayout of a nested struct field, or None for a plain field."""
    try:
        layout = data.Layout.cast(shape)
    except TypeError:
        return None
    return layout if isinstance(layout, data.StructLayout) else None


def pack_fields(layout, values, *, prefix=""):
    """The integer of `layout` with `values` (a dict; nested struct fields take
    dicts, enum members their value). Unknown names and values that do not fit
    raise ValueError."""
    layout = data.Layout.cast(layout)
    names = {name for name, _ in layout}
    for name in values:
        if name not in names:
            raise ValueError(f"{prefix}{name!r} is not a field of {layout!r}")
    word = 0
    for name, field in layout:
        value = values.get(name, 0)
        nested = struct_layout(field.shape)
        if nested is not None and isinstance(value, dict):
            value = pack_fields(nested, value, prefix=f"{prefix}{name}.")
        elif hasattr(value, "value"):
            value = value.value
        value = int(value)
        if not 0 <= value < 1 << field.width:
            raise ValueError(f"{prefix}{name}={value} does not fit in {field.width} bits")
        word |= value << field.offset
    return word


def unpack_fields(layout, word):
    """Inverse of `pack_fields`: a dict of ints (nested dicts for struct fields)."""
    out = {}
    for name, field in data.Layout.cast(layout):
        value = (int(word) >> field.offset) & ((1 << field.width) - 1)
        nested = struct_layout(field.shape)
        out[name] = unpack_fields(nested, value) if nested is not None else value
    return out
