"""The driver after faults (docs/driver.md): every fault leaves the chip reset and
the next call right or raising; nothing crashes the interpreter; Ctrl-C stops a
run; waveforms; every public argument checked; and a fuzz test of the API."""

import subprocess
import sys
import threading

import numpy as np
import pytest

from chip_configs import SHAPES, TINY
from mxu.hdl import ChipConfig
from mxu.hdl.isa import ErrorCode
from mxu.sim import Chip, ChipError, Program
from mxu.sim.cli import main
from mxu.verif import golden, programs
from mxu.verif.isa_model import IsaModel

SEED = 20261123


@pytest.fixture(scope="module")
def chip():
    return Chip(TINY)


def _matmul_is_exact(chip, rng, shape=None):
    M, K, N = shape or rng.integers(1, 13, 3)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    C = chip.matmul(A, B)
    golden.assert_bits_equal(C, golden.matmul(A, B, rows=chip.config.rows), f"{M}x{K}x{N}")
    return chip.last_stats


def _long_program(config, tiles=200):
    """A valid program of many back-to-back weight tiles: long enough to trip
    a small watchdog."""
    p = Program()
    p.load(vmem_row=0, ext_addr=0, rows=config.rows, row_bytes=2 * config.cols, push_next=True)
    p.sync("compute", pop_prev=True)
    tile = Program().loadw(vmem_row=0, k_rows=config.rows)
    tile.matmul(act_row=0, m_rows=64, out_row=0, new_weights=True)
    return p.loop(tiles, tile, [0, 0]).halt()


def test_watchdog_then_matmul_is_right(chip):
    """Row 1: the watchdog stops a run mid-program; the next matmul of another
    shape must be bit-exact with sane statistics."""
    with pytest.raises(ChipError, match="watchdog.*reset and is ready"):
        chip.run(_long_program(chip.config), max_cycles=1000)
    assert not chip.device.busy
    stats = _matmul_is_exact(chip, np.random.default_rng(SEED), (9, 13, 11))
    assert stats.cycles < 20 * stats.ideal_cycles + 2000


def _long_transfer(config, store):
    """One LOAD (or STORE) of the whole VMEM, contiguous: bursts of the
    longest length, all of them in flight at once."""
    rows, row_bytes = config.vmem_rows, config.vmem_row_bytes
    move = Program().store if store else Program().load
    return move(vmem_row=0, ext_addr=0x10000, rows=rows, row_bytes=row_bytes).halt()


@pytest.mark.parametrize("store", [False, True], ids=["load", "store"])
def test_watchdog_mid_burst_drains_then_matmul_is_right(chip, store):
    """The watchdog stops a long load (store) in the middle of its bursts,
    under random memory stalls: the driver's soft reset lets every burst in
    flight complete before it resets the core (the memory model holds no
    transaction afterwards and saw no protocol violation), and the next
    matmul is bit-exact."""
    device = chip.device
    pause = {"w": 60, "aw": 40, "b": 40} if store else {"r": 60, "ar": 40}
    device.set_memory_timing(latency=(1, 12), pause=pause, seed=SEED)
    try:
        with pytest.raises(ChipError, match="watchdog.*drained.*reset and is ready") as info:
            device.run(_long_transfer(chip.config, store), max_cycles=400)
        # STATUS bits 10:8 at the stop: the DMA had bursts in flight.
        status = int(str(info.value).split("STATUS=0x")[1].split(")")[0], 16)
        assert status >> (10 if store else 9) & 1, f"no burst in flight at the stop: {status:x}"
        assert not device.memory_busy, "a burst was cut short: the memory model still holds it"
        assert not device.busy
    finally:
        device.set_memory_timing()
    _matmul_is_exact(chip, np.random.default_rng(SEED + store), (9, 13, 11))


def test_soft_reset_timeout_names_the_stuck_channel(chip):
    """A soft reset that cannot drain in time (a long load under a slow read
    channel) hard-resets the chip and names the bursts still in flight."""
    device = chip.device
    device.set_memory_timing(latency=(1, 4), pause={"r": 95}, seed=SEED)
    try:
        device.start(_long_transfer(chip.config, store=False))
        device.clock(200)
        with pytest.raises(ChipError, match=r"did not drain within 50 cycles: the load DMA's "
                                            r"read bursts \(AR/R, ID 0\).*reset and is ready"):
            device.soft_reset(max_cycles=50)
    finally:
        device.set_memory_timing()
    assert not device.memory_busy and not device.busy
    _matmul_is_exact(chip, np.random.default_rng(SEED), (5, 4, 3))


_AFTER_FREE = """
import gc, sys
sys.path.insert(0, {tests!r})
from chip_configs import SHAPES, TINY
from mxu.sim import Chip, Program
r = Chip(TINY).run(Program().halt())
gc.collect()
assert r.memory[:4].tolist() == [0, 0, 0, 0]
m = Chip(TINY).memory[16:32]
gc.collect()
m[:] = 7
assert int(m.sum()) == 7 * 16
print("ok")
"""


def test_memory_views_outlive_their_chip(chip):
    """Row 2: views into the native memory keep the model alive (no segfault)."""
    from pathlib import Path
    code = _AFTER_FREE.format(tests=str(Path(__file__).parent))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


def test_axi_error_then_cleared_errors_then_any_program(chip):
    """Row 3: after an AXI error, clearing the injected errors is enough."""
    rng = np.random.default_rng(SEED + 1)
    chip.inject_error(0, 64)
    with pytest.raises(ChipError, match="AXI_ERROR.*reset and is ready"):
        _matmul_is_exact(chip, rng, (8, 8, 8))
    chip.clear_errors()
    assert chip.run(Program().halt()).ok
    _matmul_is_exact(chip, rng)


def test_fetch_error_reports_its_own_pc(chip):
    """Row 4: a FETCH_ERROR after a 41-instruction program reports the pc that
    failed (0), not the previous program's length."""
    p = Program()
    for _ in range(40):
        p.sync("load")
    assert len(p.halt()) == 41
    assert chip.run(p).ok
    base = 0x40000
    chip.inject_error(base, base + 16, "decerr")
    try:
        result = chip.run(Program().halt(), base=base)
    finally:
        chip.clear_errors()
    assert (result.error, result.error_pc) == (ErrorCode.FETCH_ERROR, 0)


_INTERRUPTED = """
import signal, sys
# An interactive interpreter's Ctrl-C handler (a test runner may have its
# workers ignore SIGINT, and children inherit that).
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {tests!r})
import numpy as np
from chip_configs import SHAPES, TINY
from mxu.sim import Chip
from mxu.verif import golden
from test_sim_driver import _long_program
chip = Chip(TINY)
program = _long_program(chip.config, tiles=10 ** 6)
print("running", flush=True)
try:
    chip.run(program, max_cycles=10 ** 9)
    print("finished: not interrupted")
except KeyboardInterrupt:
    print("interrupted", flush=True)
assert not chip.device.busy
rng = np.random.default_rng(3)
A, B = rng.standard_normal((9, 13)).astype(np.float32), rng.standard_normal((13, 5)).astype(np.float32)
golden.assert_bits_equal(chip.matmul(A, B), golden.matmul(A, B, rows=4), "after Ctrl-C")
print("ok")
"""


def test_ctrl_c_stops_a_run_and_leaves_the_chip_reusable(chip):
    """Row 5: SIGINT (Ctrl-C) during a long run raises KeyboardInterrupt between
    the C++ slices; the chip is reset and the next matmul is right. In a
    subprocess, as a user's interpreter would get it."""
    import signal
    from pathlib import Path
    code = _INTERRUPTED.format(tests=str(Path(__file__).parent))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "running"
    threading.Event().wait(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    assert out.split() == ["interrupted", "ok"], out + err[-2000:]


def test_waves_to_a_missing_directory_fail_before_anything_runs(capsys):
    """Row 6 (the chip is never built: the path is checked first)."""
    assert main(["matmul", "--m", "4", "--k", "4", "--n", "4", "--rows", "4", "--cols", "4",
                 "--waves", "/nonexistent/dir/x.vcd"]) == 2
    err = capsys.readouterr().err
    assert "/nonexistent/dir" in err and "does not exist" in err


def test_waveform_window_depth_and_size_warning(tmp_path, capfd, monkeypatch):
    """Row 7: a cycle window and a depth keep files small; a projected size
    above the limit prints a warning."""
    import mxu.sim.driver.chip as driver
    rng = np.random.default_rng(SEED + 3)
    A = rng.standard_normal((16, 16)).astype(np.float32)
    B = rng.standard_normal((16, 16)).astype(np.float32)
    sizes = {}
    small = SHAPES["1x1"]      # the smallest traced build
    for name, options in {"all": {}, "window": dict(waves_from=50, waves_cycles=100),
                          "shallow": dict(waves_depth=1)}.items():
        path = tmp_path / f"{name}.vcd"
        c = Chip(small, waves=str(path), **options)
        golden.assert_bits_equal(c.matmul(A, B), golden.matmul(A, B, rows=1), name)
        del c
        sizes[name] = path.stat().st_size
    assert sizes["window"] < sizes["all"] / 2 and sizes["shallow"] < sizes["all"] / 2
    monkeypatch.setattr(driver, "WAVE_WARN_BYTES", 1000)
    capfd.readouterr()
    A = rng.standard_normal((16, 16)).astype(np.float32)
    Chip(small, waves=str(tmp_path / "big.vcd")).matmul(A, A)
    assert "warning: the waveform" in capfd.readouterr().err


@pytest.mark.parametrize("relu", ["yes", None, 1.0])
def test_relu_must_be_a_bool(chip, relu):
    """Row 8."""
    with pytest.raises(TypeError, match="relu must be True or False"):
        chip.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), relu=relu)


@pytest.mark.parametrize("image, error", [({0: 5}, TypeError), ({-4: b"ab"}, ValueError),
                                          ({"x": b"ab"}, TypeError),
                                          ({(1 << 40): b"ab"}, ValueError)])
def test_memory_images_are_checked(chip, image, error):
    """Row 9."""
    with pytest.raises(error, match="memory_image"):
        chip.run(Program().halt(), image)


@pytest.mark.parametrize("code", [b"\x0f" * 20, b"", "HALT", 15])
def test_program_bytes_are_checked(chip, code):
    """Row 10."""
    with pytest.raises((ValueError, TypeError), match="program"):
        chip.run(code)


@pytest.mark.parametrize("kw, message", [
    (dict(mem_latency=(-1, -1)), "mem_latency"), (dict(mem_latency=(5, 2)), "mem_latency"),
    (dict(mem_latency=3), "mem_latency"), (dict(mem_pause={"r": 150}), "mem_pause"),
    (dict(mem_pause={"x": 5}), "mem_pause"), (dict(mem_pause={"r": 2.5}), "mem_pause"),
    (dict(waves_depth=0), "waves_depth"), (dict(fast_mac="no"), "fast_mac"),
    (dict(threads=0), "threads"), (dict(threads=2.0), "threads"), (dict(threads=99), "threads")])
def test_memory_timing_and_options_are_checked(kw, message):
    """Row 11 (checked before any build)."""
    with pytest.raises((ValueError, TypeError), match=message):
        Chip(TINY, **kw)


def test_chip_config_takes_numpy_integers():
    """Row 12."""
    config = ChipConfig(rows=np.int64(4), cols=np.int32(4), vmem_bytes=np.uint64(16 << 10))
    assert config == ChipConfig(rows=4, cols=4, vmem_bytes=16 << 10)
    assert type(config.rows) is int
    with pytest.raises(ValueError, match="ChipConfig.rows must be a positive integer"):
        ChipConfig(rows=np.float64(4))


@pytest.mark.parametrize("argv, flag", [
    (["matmul", "--m", "-1", "--k", "4", "--n", "4"], "--m"),
    (["matmul", "--m", "4", "--k", "0", "--n", "4"], "--k"),
    (["matmul", "--m", "4", "--k", "4", "--n", "x"], "--n"),
    (["matmul", "--m", "4", "--k", "4", "--n", "4", "--rows", "0"], "--rows"),
    (["matmul", "--m", "4", "--k", "4", "--n", "4", "--waves-cycles", "0"], "--waves-cycles"),
    (["mac", "--vectors", "-5"], "--vectors"),
    (["demo", "--k", "-2"], "--k")])
def test_cli_flags_are_checked_and_named(capsys, argv, flag):
    """Row 13: the flag is named, and nothing is built before the check."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "must be" in err


def test_every_cli_flag_has_help():
    from mxu.sim.cli import build_parser
    parser = build_parser()
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"mxu {name} {action.option_strings[0]} has no help text"


# ---- fuzz: random sequences of API calls ------------------------------------------

def _fuzz(chip, seed, steps):
    rng = np.random.default_rng(seed)
    config = chip.config
    checked = 0
    for step in range(steps):
        where = f"fuzz seed {seed}, step {step}"
        action = rng.choice(["matmul", "matmul", "program", "garbage", "error", "clear",
                             "watchdog", "soft_reset", "bad_argument"])
        if action == "matmul":
            try:
                _matmul_is_exact(chip, rng)
                checked += 1
            except ChipError as e:       # allowed only while errors are injected
                assert "AXI_ERROR" in str(e) or "FETCH_ERROR" in str(e), where
        elif action == "program":
            chip.memory[:0x10000] = 0
            program = programs.random_program(config, rng)
            image = programs.random_image(config, rng)
            result = chip.run(program, image, base=0x80000)
            if result.ok:
                model = IsaModel(config)
                for addr, data in image.items():
                    data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
                    model.ext[addr:addr + data.size] = data
                code = program.to_bytes()
                model.ext[0x80000:0x80000 + len(code)] = np.frombuffer(code, np.uint8)
                assert model.run(code, 0x80000).error is ErrorCode.NONE, where
                golden.assert_bits_equal(result.memory[:0x8000], model.ext[:0x8000], where)
        elif action == "garbage":
            words = rng.integers(0, 1 << 63, size=int(rng.integers(1, 6)) * 2, dtype=np.uint64)
            try:
                chip.run(words.tobytes(), max_cycles=20_000)
            except ChipError as e:
                assert "reset and is ready" in str(e), where
        elif action == "error":
            lo = int(rng.integers(0, 0x10000)) & ~63
            chip.inject_error(lo, lo + 64 * int(rng.integers(1, 64)),
                              str(rng.choice(["slverr", "decerr"])))
        elif action == "clear":
            chip.clear_errors()
        elif action == "watchdog":
            try:     # an injected error may stop the program before the watchdog does
                result = chip.run(_long_program(config, tiles=20),
                                  max_cycles=int(rng.integers(1, 500)))
                assert result.error is ErrorCode.AXI_ERROR, where
            except ChipError as e:
                assert "watchdog" in str(e) and "reset and is ready" in str(e), where
        elif action == "soft_reset":
            chip.soft_reset()
        else:
            with pytest.raises((TypeError, ValueError)):
                chip.matmul(np.ones((2, 3), np.float32), np.ones((int(rng.integers(4, 6)), 2)))
    chip.clear_errors()
    _matmul_is_exact(chip, rng)
    return checked


def test_fuzz_the_driver(chip):
    assert _fuzz(chip, SEED, 300) > 30


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_fuzz_the_driver_long(chip, seed):
    _fuzz(chip, SEED + 1000 + seed, 3000)
