"""The build cache (docs/cache.md): keys from sources, entries that are checked
before reuse and rebuilt when stale, LRU eviction, and `mxu cache`."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mxu.sim.backends import cache
from mxu.sim.backends.native import HDL_SOURCES, generator_digest
from mxu.sim.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MXU_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MXU_CACHE_LIMIT", raising=False)
    return tmp_path / "cache"


def test_editing_an_hdl_source_changes_the_key(tmp_path):
    copy = tmp_path / "hdl"
    shutil.copytree(HDL_SOURCES, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = generator_digest(copy)
    assert before == generator_digest.__wrapped__(HDL_SOURCES)
    pe = copy / "pe.py"
    pe.write_text(pe.read_text().replace("class ProcessingElement", "class  ProcessingElement"))
    assert generator_digest.__wrapped__(copy) != before
    (copy / "new_unit.py").write_text("")
    assert cache.source_digest(copy) != cache.source_digest(HDL_SOURCES)


class _Builder:
    """A build that writes one artifact and counts how often it ran."""

    def __init__(self, payload=b"artifact"):
        self.runs, self.payload = 0, payload

    def __call__(self, directory, status):
        status("writing")
        self.runs += 1
        (directory / "out.bin").write_bytes(self.payload)
        (directory / "scratch.o").write_bytes(b"x" * 1000)


def test_a_build_is_made_once_and_pruned(tmp_cache):
    build = _Builder()
    entry = cache.cached_build("test", "unit", ["k"], build, artifacts=["out.bin"])
    again = cache.cached_build("test", "unit", ["k"], build, artifacts=["out.bin"])
    assert entry == again and build.runs == 1
    assert sorted(p.name for p in entry.iterdir()) == ["meta.json", "out.bin"]
    other = cache.cached_build("test", "unit", ["other key"], build, artifacts=["out.bin"])
    assert other != entry and build.runs == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "no meta", "delete"])
def test_a_damaged_entry_is_rebuilt_not_trusted(tmp_cache, capfd, damage):
    build = _Builder(b"0123456789" * 100)
    entry = cache.cached_build("test", "unit", ["k"], build, artifacts=["out.bin"])
    artifact = entry / "out.bin"
    if damage == "truncate":
        artifact.write_bytes(artifact.read_bytes()[:10])
    elif damage == "flip":
        artifact.write_bytes(b"X" + artifact.read_bytes()[1:])
    elif damage == "no meta":
        (entry / "meta.json").unlink()
    else:
        artifact.unlink()
    capfd.readouterr()
    cache.cached_build("test", "unit", ["k"], build, artifacts=["out.bin"])
    assert build.runs == 2
    assert artifact.read_bytes() == build.payload
    assert "mxu: rebuilding test/unit-" in capfd.readouterr().err


def _compile(source, output, *args):
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(output), str(source), *args], check=True)


@pytest.mark.skipif(shutil.which("ldd") is None or shutil.which("g++") is None,
                    reason="needs ldd and g++ to make and inspect a shared library")
def test_a_library_whose_dependency_vanished_is_rebuilt(tmp_cache, tmp_path, capfd):
    """What happens to a cocotb build when the virtualenv it links is deleted."""
    dep_dir = tmp_path / "venv_lib"
    dep_dir.mkdir()
    (tmp_path / "dep.cpp").write_text("extern \"C\" int dep() { return 7; }\n")
    (tmp_path / "top.cpp").write_text("extern \"C\" int dep(); extern \"C\" int top() { return dep(); }\n")
    _compile(tmp_path / "dep.cpp", dep_dir / "libdep.so")
    runs = []

    def build(directory, status):
        runs.append(1)
        _compile(tmp_path / "top.cpp", directory / "libtop.so", f"-L{dep_dir}", "-ldep",
                 f"-Wl,-rpath,{dep_dir}")

    cache.cached_build("test", "linked", ["k"], build, artifacts=["libtop.so"])
    cache.cached_build("test", "linked", ["k"], build, artifacts=["libtop.so"])
    assert len(runs) == 1
    shutil.rmtree(dep_dir)
    capfd.readouterr()
    with pytest.raises(subprocess.CalledProcessError):
        cache.cached_build("test", "linked", ["k"], build, artifacts=["libtop.so"])
    err = capfd.readouterr().err
    assert "libdep.so" in err and "no longer resolve" in err


def test_least_recently_used_builds_are_evicted(tmp_cache, monkeypatch):
    build = _Builder(b"x" * 4000)
    entries = []
    for i in range(4):
        entries.append(cache.cached_build("test", f"e{i}", [str(i)], build, artifacts=["out.bin"]))
        os.utime(entries[-1] / "meta.json", (1000 + i, 1000 + i))
    cache.cached_build("test", "e0", ["0"], build, artifacts=["out.bin"])   # e0 used again
    monkeypatch.setenv("MXU_CACHE_LIMIT", "10000")
    deleted = cache.evict()
    assert set(deleted) == {entries[1], entries[2]}
    assert entries[0].exists() and entries[3].exists()


@pytest.mark.parametrize("text, value", [("500M", 500 << 20), ("2G", 2 << 30), ("123", 123),
                                         ("1.5GiB", 3 << 29)])
def test_cache_limit_parses_sizes(monkeypatch, text, value):
    monkeypatch.setenv("MXU_CACHE_LIMIT", text)
    assert cache.cache_limit() == value


def test_cache_limit_rejects_nonsense(monkeypatch):
    monkeypatch.setenv("MXU_CACHE_LIMIT", "lots")
    with pytest.raises(ValueError, match="MXU_CACHE_LIMIT must be a size"):
        cache.cache_limit()


def test_cache_command_reports_and_clears(tmp_cache, capsys):
    cache.cached_build("test", "unit", ["k"], _Builder(), artifacts=["out.bin"])
    assert main(["cache", "--info"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_cache) in out and "unit-" in out and "mxu cache --clear" in out
    assert main(["cache", "--clear"]) == 0
    assert cache.cache_entries() == []


def _git_clone(destination):
    subprocess.run(["git", "clone", "-q", str(ROOT), str(destination)], check=True)


def _venv(clone):
    subprocess.run([sys.executable, "-m", "venv", str(clone / ".venv")], check=True)
    pip = [str(clone / ".venv/bin/python"), "-m", "pip", "install", "-q"]
    subprocess.run(pip + ["-e", f"{clone}[dev]"], check=True, cwd=clone)


@pytest.mark.slow
def test_two_clones_in_sequence_share_a_cache(tmp_path):
    """A clone's cocotb builds link its virtualenv; after that clone and its venv
    are deleted, a second clone sharing the cache must rebuild, not crash."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the test clones the repository")
    env = dict(os.environ, MXU_CACHE=str(tmp_path / "shared-cache"))
    test = ["-m", "pytest", "-q", "-p", "no:cacheprovider",
            "tests/test_hdl_numerics.py::test_cocotb_numerics[multiplier-verilator]"]
    for i in range(2):
        clone = tmp_path / f"clone{i}"
        _git_clone(clone)
        _venv(clone)
        result = subprocess.run([str(clone / ".venv/bin/python"), *test], cwd=clone, env=env,
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        shutil.rmtree(clone)
