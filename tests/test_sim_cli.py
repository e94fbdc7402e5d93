"""The `mxu` command line: clear errors, and a small matmul end to end."""

import pytest

from mxu.sim.cli import main


def test_bad_wave_file_is_a_clear_error(capsys):
    assert main(["matmul", "--m", "2", "--k", "2", "--n", "2", "--rows", "4", "--cols", "4",
                 "--waves", "out.txt"]) == 2
    assert "waves must name a .vcd or .fst file" in capsys.readouterr().err


def test_mac_table(capsys):
    assert main(["mac", "--vectors", "5000", "--stages", "2"]) == 0
    out = capsys.readouterr().out
    assert "bit-exact: yes" in out and "seeded random" in out


@pytest.mark.parametrize("argv", [["matmul", "--m", "0", "--k", "3", "--n", "3"]])
def test_bad_shapes(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv + ["--rows", "4", "--cols", "4"])
    assert exit_.value.code == 2
    assert "argument --m: must be a positive integer, not 0" in capsys.readouterr().err


@pytest.mark.slow
def test_embed_prints_similarities_and_stats(capsys):
    assert main(["embed", "A cat sat on the mat.", "A kitten lay on the rug."]) == 0
    out = capsys.readouterr().out
    assert "[0] A cat sat on the mat." in out and "[1]" in out
    for row in ("model GMACs", "chip cycles", "utilization", "simulated MAC/s", "wall seconds"):
        assert row in out
