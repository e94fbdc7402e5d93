"""`Pod` (docs/pod.md): chips as Ray actors in processes of their own.

Its arguments are checked before Ray starts; matmuls sharded over M and N are
bit-exact against one chip and the golden model; a chip that dies (killed
between calls or in the middle of one) or stops answering raises `PodError`
naming it, closes the pod, and leaves no process behind; a new pod can be
built after that; the last pod to close shuts down the Ray it started.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from chip_configs import VPU_SHAPES
from mxu.hdl import ChipConfig
from mxu.sim import Chip, Pod, PodError
from mxu.sim.runtime import pod as pod_module
from mxu.sim.runtime import pod_chips
from mxu.verif import golden

SEED = 20261126
# The 4x4 chip with the vector unit: the other VPU tests build it too.
CONFIG = VPU_SHAPES["4x4"]
# How long a killed actor's process may take to disappear (a stopped one gets
# a few seconds of grace from its raylet): a bound on a wait, not a timing
# assertion.
GONE_WITHIN = 20.0


@pytest.fixture(scope="module")
def pod():
    with Pod(2, CONFIG) as p:
        yield p


@pytest.fixture(scope="module")
def chip():
    return Chip(CONFIG, fast_mac=True)


def _operands(M, K, N, seed=SEED):
    """Random A and B with infinities, a NaN and signed zeros sprinkled in."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    A.flat[rng.integers(A.size)] = np.inf
    A.flat[rng.integers(A.size)] = -0.0
    B.flat[rng.integers(B.size)] = np.nan
    return A, B


def _running(pid):
    """Whether process `pid` still runs (an exited zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _still_running(pids, within=GONE_WITHIN):
    """The processes of `pids` still running after waiting up to `within` s."""
    deadline = time.monotonic() + within
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _running(p)]


def _reap(pids):
    """Kill what a failed test may have left of its own pod's processes."""
    for pid in pids:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


# ---- arguments, checked before Ray is touched -----------------------------------------------
@pytest.fixture
def no_work(monkeypatch):
    """Any chip build or Ray start fails the test: argument errors come first."""
    class Started(Exception):
        pass

    def refuse(*args, **kwargs):
        raise Started("the pod started working")
    monkeypatch.setattr(pod_chips.PodChips, "_build_here", refuse)
    monkeypatch.setattr(pod_chips, "_start_ray", refuse)
    return Started


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(n_chips=0), ValueError, "n_chips must be >= 1, not 0"),
    (dict(n_chips=2.0), TypeError, "n_chips must be an integer, not 2.0"),
    (dict(n_chips=True), TypeError, "n_chips must be an integer, not True"),
    (dict(config={"rows": 4}), TypeError, "config must be a ChipConfig or None, not dict"),
    (dict(topology="mesh"), ValueError, "topology must be one of 'ring', 'torus2d', not 'mesh'"),
    (dict(topology=2), TypeError, "topology must be a string, one of 'ring', 'torus2d', not 2"),
    (dict(n_chips=4, topology="torus2d"), ValueError,
     "topology='torus2d' needs shape=(x, y) with x * y == n_chips (4)"),
    (dict(n_chips=4, topology="torus2d", shape=(2, 3)), ValueError,
     "shape (2, 3) holds 6 chips, but n_chips is 4"),
    (dict(n_chips=4, topology="torus2d", shape=(4,)), ValueError,
     "a torus2d's shape is (x, y), not (4,)"),
    (dict(n_chips=4, topology="torus2d", shape=(4, 0)), ValueError, "shape[1] must be >= 1, not 0"),
    (dict(n_chips=4, shape=(2, 2)), ValueError, "a ring's shape is (4,), not (2, 2)"),
    (dict(n_chips=4, shape=(3,)), ValueError, "shape (3,) holds 3 chips, but n_chips is 4"),
    (dict(n_chips=4, shape="2x2"), TypeError, "shape must be a tuple of integers or None, not '2x2'"),
    (dict(n_chips=4, shape=(4.0,)), TypeError, "shape[0] must be an integer, not 4.0"),
    (dict(link_bytes_per_cycle=0), ValueError, "link_bytes_per_cycle must be >= 1, not 0"),
    (dict(link_latency=1.5), TypeError, "link_latency must be an integer, not 1.5"),
    (dict(address=6379), TypeError,
     "address must be a Ray address such as 'auto' or 'ray://head:10001', or None, not 6379"),
    (dict(fast_mac="yes"), TypeError, "fast_mac must be True or False, not 'yes'"),
])
def test_bad_arguments_raise_before_any_work(no_work, kwargs, error, message):
    kwargs = dict(dict(n_chips=2), **kwargs)
    with pytest.raises(error) as info:
        Pod(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("kwargs", [
    dict(n_chips=1), dict(n_chips=3, shape=(3,)), dict(n_chips=6, topology="torus2d", shape=(2, 3)),
    dict(n_chips=4, topology="torus2d", shape=[2, 2], address="auto", link_latency=1,
         link_bytes_per_cycle=16, fast_mac=False, config=CONFIG),
])
def test_good_arguments_pass_the_checks(no_work, kwargs):
    with pytest.raises(no_work):
        Pod(**kwargs)


def test_pod_config_adds_the_links():
    ring = pod_module.pod_config(None, "ring")
    assert ring == ChipConfig.preset("pod")
    torus = pod_module.pod_config(CONFIG, "torus2d", link_latency=2000)
    assert torus.replace(links=0, link_credits=CONFIG.link_credits) == CONFIG
    assert torus.links == 4
    # A flit a cycle over a round trip of 2 x 2000 cycles needs 4000 credits.
    assert torus.link_credits == 4096


# ---- one pod, shared ---------------------------------------------------------------------
def test_pod_describes_itself(pod):
    assert len(pod) == pod.n_chips == 2
    assert pod.config == pod_module.pod_config(CONFIG, "ring")
    assert pod.topology == "ring" and pod.shape == (2,)
    assert len(set(pod.pids)) == 2 and os.getpid() not in pod.pids
    assert repr(pod) == "Pod(2 chips, ring 2, 4x4 vpu chips, fast MAC, open)"


@pytest.mark.parametrize("shard", ["m", "n"])
@pytest.mark.parametrize("M, K, N", [
    (8, 16, 8),       # even split
    (37, 50, 29),     # uneven: the first chip takes one more row or column
    (1, 9, 1),        # fewer rows and columns than chips: the second chip idles
])
def test_sharded_matmul_is_bit_exact(pod, chip, shard, M, K, N):
    A, B = _operands(M, K, N)
    C = pod.matmul(A, B, shard=shard)
    golden.assert_bits_equal(C, chip.matmul(A, B), f"pod shard={shard} vs one chip", seed=SEED)
    golden.assert_bits_equal(C, golden.matmul(A, B, rows=CONFIG.rows),
                             f"pod shard={shard} vs golden", seed=SEED)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_all_reduce_is_the_golden_ring_sum(pod, rows, bidirectional):
    """Rows fewer than chips, uneven chunks, several blocks; -0, inf and NaN;
    one way round the ring, or half each way."""
    rng = np.random.default_rng(SEED + rows)
    xs = rng.standard_normal((2, rows, CONFIG.cols)).astype(np.float32)
    xs[0, 0, 0], xs[1, 0, 0], xs[1, -1, -1] = -0.0, -0.0, np.inf
    xs[0, -1, 0] = np.nan
    out = pod.all_reduce([xs[0], xs[1]], bidirectional=bidirectional)
    want = golden.ring_reduce(xs, bidirectional=bidirectional)
    for i in range(2):
        golden.assert_bits_equal(out[i], want, f"chip {i}'s all-reduce", seed=SEED)
    stats = pod.last_stats
    assert stats.nbytes == xs[0].nbytes and 0 < stats.link_cycles < stats.cycles
    # busbw: NCCL's, of the run's link cycles, over what one link carries.
    assert stats.busbw == pod_module.busbw("all_reduce", stats.nbytes, 2, stats.link_cycles)
    link = pod_module.link_bandwidth(pod.config, pod.link_bytes_per_cycle)
    assert stats.busbw_fraction == stats.busbw / link


def test_reduce_scatter_and_all_gather(pod):
    rng = np.random.default_rng(SEED)
    xs = [rng.standard_normal((5, 7)).astype(np.float32) for _ in range(2)]
    parts = pod.reduce_scatter(xs)
    total = golden.ring_reduce_arrays(xs, CONFIG.cols).ravel()
    # Chip i holds chunk i + 1 of the rows: chip 1 the first, chip 0 the rest.
    rows = -(-35 // CONFIG.cols)
    half = -(-rows // 2) * CONFIG.cols
    golden.assert_bits_equal(parts[1], total[:half], "chip 1's part")
    golden.assert_bits_equal(parts[0], total[half:], "chip 0's part")
    gathered = pod.all_gather(xs)
    for j in range(2):
        for i in range(2):
            golden.assert_bits_equal(gathered[j, i], xs[i], f"chip {j}'s copy of chip {i}'s")


@pytest.mark.parametrize("M, K, N", [(8, 16, 8), (5, 37, 9), (3, 1, 4)])
def test_k_sharded_matmul_is_the_golden_pod_form(pod, M, K, N):
    A, B = _operands(M, K, N)
    C = pod.matmul(A, B, shard="k")
    lo = -(-K // 2)
    partials = [golden.matmul(A[:, :lo], B[:lo], rows=CONFIG.rows),
                golden.matmul(A[:, lo:], B[lo:], rows=CONFIG.rows) if K > 1
                else np.zeros((M, N), np.float32)]
    golden.assert_bits_equal(C, golden.ring_reduce_arrays(partials, CONFIG.cols),
                             "pod shard='k' vs the golden pod form", seed=SEED)


def test_a_pod_run_is_deterministic(pod):
    """The same collective twice: the same bits and the same cycles."""
    xs = [np.full((9, CONFIG.cols), i + 0.5, np.float32) for i in range(2)]
    first = pod.all_reduce(xs)
    stats = pod.last_stats
    golden.assert_bits_equal(pod.all_reduce(xs), first, "the second run")
    assert pod.last_stats == stats


def test_tensor_parallel_layer_is_the_golden_pod_form(pod):
    """A small encoder layer split over the pod's two chips (heads and FFN
    columns), one sequence padded: bit-exact to the golden pod form."""
    from mxu.sim.models.encoder import EncoderConfig, LayerWeights
    from mxu.sim.models.parallel import TensorParallelLayer
    from mxu.verif.transformer import golden_tensor_parallel_layer
    cfg = EncoderConfig(hidden=32, heads=4, ffn=64, layers=1)
    w = LayerWeights.random(cfg, np.random.default_rng(SEED))
    B, L = 2, 16
    x = np.random.default_rng(SEED + 1).standard_normal((B * L, cfg.hidden)).astype(np.float32)
    mask = np.ones((B, L), bool)
    mask[1, 11:] = False
    layer = TensorParallelLayer(pod, cfg, w)
    out = layer(x, mask)
    want = golden_tensor_parallel_layer(w, cfg, x, mask, pod.config.rows, pod.config.cols, 2)
    golden.assert_bits_equal(out, want, "tensor-parallel layer", seed=SEED)
    assert layer.last_cycles == sum(layer.last_phases.values())
    with pytest.raises(ValueError, match="must be a multiple of the chips"):
        layer(x[:15], mask[:1, :15])
    with pytest.raises(ValueError, match="the heads .3. must be a multiple of the pod's chips"):
        TensorParallelLayer(pod, EncoderConfig(hidden=24, heads=3, ffn=64, layers=1),
                            LayerWeights.random(EncoderConfig(hidden=24, heads=3, ffn=64,
                                                              layers=1), np.random.default_rng(0)))


def test_ring_and_torus_links_pair_up():
    for peers in (pod_module.ring_peers(3), pod_module.ring_peers(6, "torus2d", (3, 2))):
        assert all(peers[peers[end]] == end for end in peers)
    torus = pod_module.ring_peers(6, "torus2d", (3, 2))
    assert torus[(2, 0)] == (0, 1) and torus[(4, 2)] == (1, 3)


@pytest.mark.parametrize("A, B, shard, error, message", [
    (np.ones((4, 4)), np.ones((4, 4)), "x", ValueError, "shard must be one of 'm', 'n', 'k', not 'x'"),
    ([[1.0]], np.ones((1, 4)), "m", TypeError, "A must be a numpy array, not list"),
    (np.ones((2, 4, 4)), np.ones((4, 4)), "m", ValueError,
     "A must be 2-D, not 3-D with shape (2, 4, 4)"),
    (np.ones((4, 4)), np.ones((4, 0)), "n", ValueError, "B has an empty dimension: shape (4, 0)"),
    (np.ones((4, 5)), np.ones((4, 4)), "m", ValueError,
     "inner dimensions differ: A is (4, 5), B is (4, 4)"),
])
def test_matmul_checks_its_arguments(pod, A, B, shard, error, message):
    with pytest.raises(error) as info:
        pod.matmul(A, B, shard=shard)
    assert str(info.value) == message


def test_a_pod_takes_no_device_tensors(pod, chip):
    with pytest.raises(TypeError, match="device tensor lives on one chip"):
        pod.matmul(chip.upload(np.ones((4, 4), np.float32)), np.ones((4, 4), np.float32))


def test_matmul_too_big_for_a_chip_is_refused(pod):
    # Each chip's share must fit its external memory: here B alone fills it.
    K = CONFIG.ext_mem_bytes // 4
    with pytest.raises(ValueError, match="needs .* bytes of external memory"):
        pod.matmul(np.ones((2, K), np.float32), np.ones((K, 2), np.float32))


def test_a_chips_own_errors_come_back_unchanged(pod):
    # The chips check dtypes with Chip.matmul's message; the pod stays open.
    with pytest.raises(TypeError, match=r"A must be a float array \(bfloat16, float16/32/64\), "
                                        r"not int32") as info:
        pod.matmul(np.ones((4, 4), np.int32), np.ones((4, 4), np.float32))
    if sys.version_info >= (3, 11):     # exception notes
        assert info.value.__notes__ == ["raised by chip 0 of 2 during matmul shard='m'"]
    A, B = _operands(5, 6, 7)
    golden.assert_bits_equal(pod.matmul(A, B), golden.matmul(A, B, rows=CONFIG.rows), "after an error")


def test_timeout_is_checked(pod):
    with pytest.raises(ValueError, match="timeout must be > 0 seconds, not 0"):
        pod.timeout = 0
    with pytest.raises(TypeError, match="timeout must be a number of seconds, not '1'"):
        pod.timeout = "1"
    assert pod.timeout == pod_module.DEFAULT_TIMEOUT


# ---- faults: each test builds, breaks and closes a pod of its own ------------------------
# (They ask for the shared pod only so that they share its Ray instance.)
def _broken(kill, call=None):
    """Build a 2-chip pod, let `kill(pod)` break it, make one call (a
    matmul): the PodError, and the chips' pids (checked gone)."""
    pod = Pod(2, CONFIG)
    pids = list(pod.pids)
    try:
        A, B = _operands(9, 10, 11)
        kill(pod)
        with pytest.raises(PodError) as info:
            (call or (lambda p: p.matmul(A, B)))(pod)
        assert _still_running(pids) == []
        return pod, info.value
    finally:
        _reap(pids)


def test_chip_killed_between_calls(pod):
    broken, error = _broken(lambda p: os.kill(p.pids[1], signal.SIGKILL))
    assert str(error).startswith("chip 1 of 2 died during matmul shard='m': ")
    assert error.chip == 1
    # The pod is closed now: it says why, and closing again does nothing.
    with pytest.raises(PodError, match=r"the pod is closed after chip 1 of 2 died"):
        broken.matmul(np.ones((2, 2)), np.ones((2, 2)))
    broken.close()


def test_chip_killed_during_a_call(pod):
    def kill_during_call(p):
        # Stopped, chip 0 cannot finish the call that follows; the timer
        # kills it while the pod waits for it.
        os.kill(p.pids[0], signal.SIGSTOP)
        threading.Timer(0.5, os.kill, (p.pids[0], signal.SIGKILL)).start()
    _, error = _broken(kill_during_call)
    assert str(error).startswith("chip 0 of 2 died during matmul shard='m': ")
    assert error.chip == 0


def test_chip_killed_during_a_run_in_windows(pod):
    """A collective: the chips run in lockstep windows, each a call."""
    def kill_during_run(p):
        os.kill(p.pids[1], signal.SIGSTOP)
        threading.Timer(0.5, os.kill, (p.pids[1], signal.SIGKILL)).start()
    xs = [np.ones((64, CONFIG.cols), np.float32)] * 2
    _, error = _broken(kill_during_run, lambda p: p.all_reduce(xs))
    assert str(error).startswith("chip 1 of 2 died during the start of all_reduce: ")
    assert error.chip == 1


def test_chip_that_does_not_answer_times_out(pod):
    def stop(p):
        p.timeout = 1
        os.kill(p.pids[1], signal.SIGSTOP)
    _, error = _broken(stop)
    assert str(error).startswith("chip 1 of 2 did not answer within 1 s during matmul shard='m'")
    assert error.chip == 1


def test_a_pod_is_built_again_after_a_failure_and_closes_clean(pod):
    _broken(lambda p: os.kill(p.pids[0], signal.SIGKILL))
    with Pod(2, CONFIG) as again:
        pids = list(again.pids)
        A, B = _operands(6, 7, 5)
        golden.assert_bits_equal(again.matmul(A, B, shard="n"), golden.matmul(A, B, rows=CONFIG.rows),
                                 "a new pod")
    try:
        assert _still_running(pids) == []
        with pytest.raises(PodError, match="the pod is closed; build a new Pod"):
            again.matmul(A, B)
    finally:
        _reap(pids)


def test_the_last_pod_shuts_down_the_ray_it_started():
    # In a fresh interpreter, so that no other pod is open: Ray is up while
    # either pod is, a pod dropped without close() is closed by the garbage
    # collector, and Ray is down after the last one.
    script = textwrap.dedent("""
        import gc, json, ray
        from chip_configs import VPU_SHAPES
        from mxu.sim import Pod
        first = Pod(1, VPU_SHAPES["4x4"])
        second = Pod(1, VPU_SHAPES["4x4"])
        pids = first.pids + second.pids
        first.close()
        up_with_second = ray.is_initialized()
        del second
        gc.collect()
        print(json.dumps([pids, first.started_ray, up_with_second, ray.is_initialized()]))
    """)
    tests = Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=str(tests))
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    pids, started, up_with_second, up_after = json.loads(out.stdout.strip().splitlines()[-1])
    try:
        assert (started, up_with_second, up_after) == (True, True, False)
        assert _still_running(pids) == []
    finally:
        _reap(pids)


# ---- data parallel: the default pod (16x16 chips with the vector unit) -----------------------
def test_data_parallel_encode_is_one_chips_bit_for_bit(pod):
    """Two chips encode a corpus, batch k on chip k mod 2; the embeddings are
    one chip's (of the same configuration) bit for bit."""
    from mxu.sim.models.sentence import SentenceEncoder
    texts = ["A pod of chips.", "Each chip is a Ray actor in its own process.",
             "Links carry flits between lockstep windows.", "bf16 in, fp32 out."]
    with Pod(2) as big:
        on_pod = SentenceEncoder(pod=big, batch_size=2, vector_ops="chip")
        emb = on_pod.encode(texts, show_progress_bar=False)
        one = SentenceEncoder(chip=Chip(big.config, fast_mac=True), batch_size=2,
                              vector_ops="chip")
        golden.assert_bits_equal(emb, one.encode(texts, show_progress_bar=False),
                                 "2-chip data-parallel encode vs one chip")
        # Two batches, one per chip: the pod's time is one batch's.
        assert on_pod.last_pod_cycles < on_pod.last_stats.cycles == one.last_stats.cycles
    with pytest.raises(ValueError, match="give a chip or a pod, not both"):
        SentenceEncoder(pod=pod, chip=Chip(CONFIG, fast_mac=True))


def _descendants(root):
    """Pids of every process under `root` (from /proc's parent links)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def test_a_killed_driver_leaves_no_ray_process_behind(tmp_path):
    """SIGKILL of a script holding a pod: the raylet, GCS, the chips' actors
    and Ray's DashboardAgent and RuntimeEnvAgent (which outlive their raylet
    and ignore SIGTERM) are all gone soon after; the session's watcher
    (`mxu.sim.runtime.reaper`) kills what Ray leaves."""
    script = textwrap.dedent("""
        import sys, time
        from chip_configs import VPU_SHAPES
        from mxu.sim import Pod
        pod = Pod(1, VPU_SHAPES["4x4"])
        print("ready", flush=True)
        time.sleep(600)
    """)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, cwd=tmp_path)
    pids = []
    try:
        assert driver.stdout.readline().strip() == "ready"
        pids = _descendants(driver.pid)
        names = {open(f"/proc/{p}/cmdline").read().split("\0")[0] for p in pids if _running(p)}
        # What was left behind before the watcher: the agents are there to be killed.
        assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names, names
        assert any(n.endswith("raylet") for n in names), names
        driver.kill()
        driver.wait()
        assert _still_running(pids) == []
    finally:
        driver.kill()
        _reap(pids)
