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


# Every output path of every subcommand, each checked before any build or run
# (issue 46): (argv with {path} where the path goes, the flag the error names).
_OUTPUT_FLAGS = [
    (["profile", "--m", "2", "--k", "2", "--n", "2", "-o", "{path}"], "-o"),
    (["profile", "--m", "2", "--k", "2", "--n", "2", "--png", "{path}"], "--png"),
    (["embed", "text", "--profile", "{path}"], "--profile"),
    (["embed", "text", "--profile", "ok.json", "--png", "{path}"], "--png"),
    (["matmul", "--m", "2", "--k", "2", "--n", "2", "--waves", "{path}"], "--waves"),
    (["export", "--unit", "mac", "-o", "{path}"], "-o"),
    (["synth", "--unit", "mac", "--json", "{path}"], "--json"),
]


def _bad_file(kind, tmp_path):
    """A file path that cannot be written, and the reason the error gives."""
    return {"missing directory": (str(tmp_path / "missing" / "out.vcd"), "does not exist"),
            "is a directory": (str(tmp_path), "is a directory"),
            "not writable": ("/proc/out.vcd", "is not writable")}[kind]


def _run_cli(argv, capsys):
    """`main(argv)`: (exit status, stderr), whether it returns or exits."""
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("kind", ["missing directory", "is a directory", "not writable"])
@pytest.mark.parametrize("argv,flag", _OUTPUT_FLAGS, ids=[f"{a[0]} {f}" for a, f in _OUTPUT_FLAGS])
def test_bad_output_path_is_a_one_line_error_before_any_work(argv, flag, kind, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    path, reason = _bad_file(kind, tmp_path)
    status, err = _run_cli([a.replace("{path}", path) for a in argv], capsys)
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"mxu {argv[0]}: error: {flag}: ") and reason in err, err


@pytest.mark.parametrize("kind,path,reason", [
    ("missing parent", "/proc/mxu-out", "is not writable"),
    ("a file", "/etc/hostname", "is a file, not a directory")])
@pytest.mark.parametrize("argv,flag", [(["prove", "-o"], "-o"),
                                       (["synth", "--unit", "mac", "--workdir"], "--workdir")])
def test_bad_output_directory(argv, flag, kind, path, reason, capsys):
    status, err = _run_cli(argv + [path], capsys)
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"mxu {argv[0]}: error: {flag}: ") and reason in err, err


_SIMULATING = [["cache", "--info"], ["cache", "--clear"], ["mac", "--vectors", "10"],
               ["matmul", "--m", "2", "--k", "2", "--n", "2"], ["demo", "--no-embed"],
               ["profile", "--m", "2", "--k", "2", "--n", "2"], ["embed", "text"],
               ["generate", "hi"]]


@pytest.mark.parametrize("cache,reason", [("/proc/mxu-cache", "is not writable"),
                                          ("/etc/hostname", "is a file, not a directory")])
@pytest.mark.parametrize("argv", _SIMULATING, ids=[" ".join(a[:2]) for a in _SIMULATING])
def test_bad_cache_directory_is_a_one_line_error(argv, cache, reason, capsys, monkeypatch,
                                                 tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MXU_CACHE", cache)
    status, err = _run_cli(argv, capsys)
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"mxu {argv[0]}: error: $MXU_CACHE: ") and reason in err, err


@pytest.mark.parametrize("argv,message", [
    (["generate", "hi", "--temperature", "nan"], "argument --temperature: must be a finite number"),
    (["generate", "hi", "--temperature", "inf"], "argument --temperature: must be a finite number"),
])
def test_bad_temperature(argv, message, capsys):
    status, err = _run_cli(argv, capsys)
    assert status == 2 and message in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv,message", [
    (["generate", "hi", "--top-k", "5"], "top_k applies to sampling only: give a temperature > 0"),
    (["generate", "hi", "--seed", "1"], "seed applies to sampling only: give a temperature > 0"),
    (["generate", "hi\udcff"], "the prompt is not valid UTF-8: byte offset 2 (0xff)"),
    (["embed", "text", "--png", "t.png"], "--png draws the timeline of a profile: give --profile"),
])
def test_inputs_that_would_be_ignored_or_garbled_are_errors_before_the_build(argv, message,
                                                                             capsys, monkeypatch):
    """Checked before the chip is built: a build here would fail the test."""
    import mxu.sim.runtime.chip as chip_module
    monkeypatch.setattr(chip_module, "Chip", None)
    status, err = _run_cli(argv, capsys)
    assert status == 2, err
    assert err.startswith(f"mxu {argv[0]}: error: {message}") and err.count("\n") == 1, err


def test_non_utf8_bytes_on_the_command_line(tmp_path):
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-m", "mxu.sim.cli", "generate", b"ab\xfe"],
                         capture_output=True, cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr == b"mxu generate: error: the prompt is not valid UTF-8: byte offset 2 " \
                         b"(0xfe)\n"


def test_an_error_after_the_echoed_prompt_goes_on_its_own_line(capsys, monkeypatch):
    """The streamed prompt ends its line before the error is printed."""
    import io

    import mxu.sim.models as models
    import mxu.sim.runtime.chip as chip_module
    from mxu.sim.cli import generate_text

    class FailingLM:
        def __init__(self, name, chip, weights):
            assert weights == "gguf"

        def generate(self, *args, **kwargs):
            raise ValueError("too long")

    monkeypatch.setattr(chip_module, "Chip", lambda *a, **k: None)
    monkeypatch.setattr(models, "CausalLM", FailingLM)
    out = io.StringIO()
    with pytest.raises(ValueError, match="too long"):
        generate_text("hi", out=out)
    assert out.getvalue() == "hi\n"


def _subcommands():
    from mxu.sim.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_subcommand_has_a_description_and_an_example(name):
    parser = _subcommands()[name]
    text = parser.format_help()
    assert parser.description and "\n" not in parser.description.strip(), name
    assert f"example:\n  mxu {name} " in text, text


def test_one_convention_for_pes_and_presets():
    """Every simulating command takes --rtl (the fast array is the default)
    and still accepts --fast-mac (a no-op); --preset lists every preset."""
    from mxu.hdl.config import _PRESETS
    from mxu.sim.cli import preset_names
    assert preset_names() == sorted(_PRESETS) and "llm" in preset_names()
    commands = _subcommands()
    for name, argv in [("demo", []), ("matmul", ["--m", "2", "--k", "2", "--n", "2"]),
                       ("embed", ["x"]), ("generate", ["x"]),
                       ("profile", ["--m", "2", "--k", "2", "--n", "2"])]:
        assert commands[name].parse_args(argv).rtl is False
        assert commands[name].parse_args(argv + ["--rtl"]).rtl is True
        assert commands[name].parse_args(argv + ["--fast-mac"]).rtl is False
    for name in ("synth", "export"):
        text = " ".join(commands[name].format_help().split())
        assert "--preset" in text and all(p in text for p in preset_names()), text
    assert "--sizes" in commands["prove"].format_help()
    assert "--preset" not in commands["prove"].format_help()


def _generate_table(monkeypatch, preset, decode_cycles=8_000_000, decode_tokens=4):
    """`generate_text`'s output for a stand-in model whose stats are given
    (no chip is built: the table's wording is what is tested)."""
    import io
    from types import SimpleNamespace

    import mxu.sim.models as models
    import mxu.sim.runtime.chip as chip_module
    from mxu.sim.cli import generate_text
    from mxu.sim.models.causal_lm import GenerationStats, PhaseStats

    class FakeLM:
        def __init__(self, name, chip, weights):
            self.chip, self.name = chip, name

        def generate(self, prompt, stream=None, **kwargs):
            stream(0, " Paris")
            self.last_stats = GenerationStats(
                prefill=PhaseStats(steps=1, tokens=5, cycles=3_000_000),
                decode=PhaseStats(steps=decode_tokens, tokens=decode_tokens,
                                  cycles=decode_cycles, wall_seconds=3.0 * decode_tokens),
                prompt_tokens=5, new_tokens=decode_tokens + 1,
                weight_formats={"Q4_1": 66_000_000})
            return " Paris"

    monkeypatch.setattr(chip_module, "Chip", lambda config, fast_mac: SimpleNamespace(
        config=config))
    monkeypatch.setattr(models, "CausalLM", FakeLM)
    out = io.StringIO()
    generate_text("The capital of France is", preset=preset, out=out)
    return out.getvalue()


def test_generate_gives_no_tokens_per_second_for_a_chip_never_routed(monkeypatch):
    """The llm chip was never placed and routed: cycles and cycles per token,
    and no clock borrowed from another preset."""
    from mxu.hdl.config import MEASURED_FMAX_MHZ
    assert "llm" not in MEASURED_FMAX_MHZ
    text = _generate_table(monkeypatch, "llm")
    assert text.startswith("The capital of France is Paris\n"), text
    assert "8,000,000 cycles in 4 steps; 2,000,000 cycles/token" in text, text
    assert "MHz" not in text, text
    assert "the llm chip was never placed and routed" in text, text
    assert "wall s per decode token 3.00" in " ".join(text.split()), text


def test_generate_gives_tokens_per_second_at_the_presets_own_measured_clock(monkeypatch):
    from mxu.hdl import config
    monkeypatch.setattr(config, "MEASURED_FMAX_MHZ",
                        {"vpu": config.MeasuredFmax(50.0, commit="abc1234", seed=2)})
    # 4 tokens in 8e6 cycles at 50 MHz: 0.16 s, 25 tokens/s.
    text = _generate_table(monkeypatch, "vpu")
    assert "decode tokens/s 25.0 at 50.0 MHz (commit abc1234, seed 2)" in " ".join(text.split()), \
        text
    assert "on the vpu chip" in text
    # The llm chip does not borrow the vpu chip's clock.
    assert "MHz" not in _generate_table(monkeypatch, "llm")


def test_generate_preset_defaults_to_llm_and_needs_the_vector_unit(capsys, monkeypatch):
    import mxu.sim.runtime.chip as chip_module
    assert _subcommands()["generate"].parse_args(["x"]).preset == "llm"
    monkeypatch.setattr(chip_module, "Chip", None)      # checked before any build
    status, err = _run_cli(["generate", "hi", "--preset", "fpga"], capsys)
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith("mxu generate: error: --preset fpga has no vector unit") \
        and "llm" in err, err
