"""Packing Python values into `data.StructLayout` bit patterns and back: the one
place where the assembler, the DMA models and the testbenches turn field dicts
into the integers the hardware sees."""

from amaranth.lib import data

__all__ = ["pack_fields", "unpack_fields", "struct_layout", "field_plan"]


def struct_layout(shape):
    """The StructLayout of a nested struct field, or None for a plain field."""
    try:
        layout = data.Layout.cast(shape)
    except TypeError:
        return None
    return layout if isinstance(layout, data.StructLayout) else None


_PLANS = {}


def _plan(layout):
    """{name: (offset, width, nested layout or None)} of a layout, computed once:
    walking an Amaranth layout is slow, and the compiler packs hundreds of
    thousands of words for one model."""
    key = id(layout)
    entry = _PLANS.get(key)
    if entry is None or entry[0] is not layout:
        cast = data.Layout.cast(layout)
        fields = {name: (f.offset, f.width, struct_layout(f.shape)) for name, f in cast}
        entry = _PLANS[key] = (layout, cast, fields)
    return entry[1:]


def field_plan(layout):
    """{name: (offset, width, nested layout or None)} of a layout's fields."""
    return _plan(layout)[1]


def pack_fields(layout, values, *, prefix=""):
    """The integer of `layout` with `values` (a dict; nested struct fields take
    dicts, enum members their value; fields not given are 0). Unknown names and
    values that do not fit raise ValueError."""
    cast, fields = _plan(layout)
    word = 0
    for name, value in values.items():
        try:
            offset, width, nested = fields[name]
        except KeyError:
            raise ValueError(f"{prefix}{name!r} is not a field of {cast!r}") from None
        if nested is not None and isinstance(value, dict):
            value = pack_fields(nested, value, prefix=f"{prefix}{name}.")
        elif hasattr(value, "value"):
            value = value.value
        value = int(value)
        if not 0 <= value < 1 << width:
            raise ValueError(f"{prefix}{name}={value} does not fit in {width} bits")
        word |= value << offset
    return word


def unpack_fields(layout, word):
    """Inverse of `pack_fields`: a dict of ints (nested dicts for struct fields)."""
    word = int(word)
    out = {}
    for name, (offset, width, nested) in _plan(layout)[1].items():
        value = (word >> offset) & ((1 << width) - 1)
        out[name] = unpack_fields(nested, value) if nested is not None else value
    return out
