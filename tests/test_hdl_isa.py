"""The ISA's single definition: encodings round-trip, docs/isa.md matches it."""

from pathlib import Path

import pytest

from mxu.hdl import isa
from mxu.hdl.isa import Opcode, SeedMode, encode, decode, field_table

DOC = Path(__file__).parent.parent / "docs" / "isa.md"


def test_every_layout_is_128_bits():
    for layout in isa.INSTRUCTIONS.values():
        assert layout.as_shape().size == isa.INSTR_BITS


def test_encode_decode_round_trip():
    word = encode(Opcode.MATMUL, deps={"pop_prev": 1, "push_next": 1},
                  flags={"seed_mode": SeedMode.BIAS, "new_weights": 1},
                  act_row=0xABCDE, m_rows=0xFFFF, out_row=3, seed_row=0xFFFFF)
    opcode, fields = decode(word)
    assert opcode is Opcode.MATMUL
    assert fields["deps"] == {"pop_prev": 1, "pop_next": 0, "push_prev": 0, "push_next": 1}
    assert fields["flags"]["seed_mode"] == SeedMode.BIAS.value
    assert (fields["act_row"], fields["m_rows"], fields["seed_row"]) == (0xABCDE, 0xFFFF, 0xFFFFF)


def test_values_that_do_not_fit_are_rejected():
    with pytest.raises(ValueError, match="m_rows=65536 does not fit in 16 bits"):
        encode(Opcode.MATMUL, m_rows=1 << 16)
    with pytest.raises(ValueError, match="'bogus' is not a field"):
        encode(Opcode.HALT, bogus=1)
    with pytest.raises(ValueError, match="illegal opcode"):
        decode(14)


def test_docs_tables_match_the_layouts():
    text = DOC.read_text()
    for layout in (isa.DmaInstr, isa.LoadWInstr, isa.MatmulInstr, isa.SyncInstr, isa.HaltInstr,
                   isa.LoopInstr, isa.VectorInstr, isa.LinkInstr):
        assert field_table(layout) in text, f"docs/isa.md is out of date for {layout.__name__}"
    for code in isa.ErrorCode:
        assert f"`{code.name}`" in text
