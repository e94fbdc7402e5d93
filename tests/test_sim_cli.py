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


@pytest.mark.parametrize("command", ["profile", "matmul", "demo"])
def test_huge_matmul_is_a_one_line_error_before_anything_runs(command, capsys):
    """The size is checked against external memory before the chip is built
    or the operands allocated (issue 28: profile died in NumPy with a
    MemoryError traceback)."""
    argv = [command, "--m", "99999999", "--k", "99999", "--n", "9999"]
    assert main(argv + (["--no-embed"] if command == "demo" else [])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "needs 24,001,399,540,160 bytes of external memory" in err
    assert "the chip has 67,108,864 (ChipConfig.ext_mem_bytes)" in err


@pytest.mark.parametrize("command", [["profile", "--m", "2", "--k", "2", "--n", "2"],
                                     ["matmul", "--m", "2", "--k", "2", "--n", "2"],
                                     ["embed", "text"]])
def test_array_size_limit(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(command + ["--rows", "65"])
    assert exit_.value.code == 2
    assert "argument --rows: must be at most 64 for a simulated chip" in capsys.readouterr().err


def test_host_memory_exhaustion_is_a_one_line_error(capsys):
    assert main(["mac", "--vectors", str(10 ** 15)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mxu mac: error: the host ran out of memory") and err.count("\n") == 1
