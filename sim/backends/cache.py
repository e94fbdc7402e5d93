"""The build cache (docs/cache.md).

Every simulator build lives in its own directory, ``<root>/<kind>/<name>-<key>``,
where the key hashes everything the build depends on: the sources that generate
its Verilog (not the Verilog itself, so that a cached model loads without running
Amaranth), its flags, the tool versions, and the libraries it links at run time.

An entry is trusted only if its ``meta.json`` (written last) is there, every
artifact has the size and SHA-256 recorded in it, and every shared library an
artifact links still resolves. Anything else is rebuilt, with one line saying
why. Entries keep only what a later run needs, and the least recently used are
evicted above a size limit (``$MXU_CACHE_LIMIT``, default 4 GiB).
"""

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .status import BuildStatus
from .toolchain import tool_versions

__all__ = ["cache_root", "cache_path", "cache_limit", "content_hash", "source_digest", "cached_build",
           "cache_entries", "evict", "clear_cache", "META"]

META = "meta.json"
DEFAULT_LIMIT = 4 << 30
_SOURCE_SUFFIXES = (".py", ".cpp", ".h", ".v")


def cache_path():
    """Where the cache of simulator builds lives: ``$MXU_CACHE``, else
    ~/.cache/mxu (not created here)."""
    env = os.environ.get("MXU_CACHE")
    return Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mxu"


def cache_root():
    """Directory of cached simulator builds (`cache_path`), made if missing;
    a ValueError naming it when it cannot be."""
    root = cache_path()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"the build cache {str(root)!r} ($MXU_CACHE) cannot be made: "
                         f"{error.strerror or error}") from None
    if not root.is_dir():
        raise ValueError(f"the build cache {str(root)!r} ($MXU_CACHE) is not a directory")
    return root


def _last_build_seconds(kind_dir, name):
    """How long the newest earlier build of `name` took (its meta records
    it), for the status line's time left; None if none did."""
    best = None
    for meta in kind_dir.glob(f"{name}-*/{META}"):
        try:
            data = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if data.get("name") == name and "build_seconds" in data and \
                (best is None or data["created"] > best[0]):
            best = (data["created"], data["build_seconds"])
    return best[1] if best else None


def cache_limit():
    """The cache's size limit in bytes: ``$MXU_CACHE_LIMIT`` ("500M", "8G", bytes)."""
    text = os.environ.get("MXU_CACHE_LIMIT", "").strip()
    if not text:
        return DEFAULT_LIMIT
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"MXU_CACHE_LIMIT must be a size such as 500M or 8G, not {text!r}")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[match[2].upper()]
    return int(float(match[1]) * scale)


def content_hash(*parts):
    """A short SHA-256 of strings and bytes, in order."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else bytes(part))
        h.update(b"\0")
    return h.hexdigest()[:16]


def source_digest(*paths):
    """SHA-256 over the contents and relative names of source files: each path is
    a file or a directory searched recursively for .py/.cpp/.h/.v files. Any edit,
    added or removed file changes it."""
    h = hashlib.sha256()
    for path in map(Path, paths):
        files = sorted(p for p in path.rglob("*") if p.suffix in _SOURCE_SUFFIXES
                       and "__pycache__" not in p.parts) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode() + b"\0")
            h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _unresolved_libraries(path):
    """Shared libraries `path` (an ELF executable or library) needs that the
    loader cannot find now; [] if all resolve or ``ldd`` is not available."""
    ldd = shutil.which("ldd")
    if not ldd:
        return []
    out = subprocess.run([ldd, str(path)], capture_output=True, text=True).stdout
    return [line.split("=>")[0].strip() for line in out.splitlines() if "not found" in line]


def _stale_reason(entry, artifacts):
    """Why `entry` cannot be trusted, or None."""
    meta_path = entry / META
    if not entry.exists():
        return "absent"
    if not meta_path.exists():
        return "its build never finished (no meta.json)"
    try:
        meta = json.loads(meta_path.read_text())
        recorded = meta["artifacts"]
    except (ValueError, KeyError):
        return "its meta.json is unreadable"
    for name in artifacts:
        path = entry / name
        info = recorded.get(name)
        if info is None or not path.exists():
            return f"{name} is missing"
        if path.stat().st_size != info["size"] or _sha256(path) != info["sha256"]:
            return f"{name} is corrupted (its size or SHA-256 differs from the record)"
        if info.get("linked"):
            missing = _unresolved_libraries(path)
            if missing:
                return f"{name} links {', '.join(missing)}, which no longer resolve"
    return None


@contextlib.contextmanager
def _locked(lock_path, blocking=True):
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _lock_path(entry):
    return entry.parent / ".locks" / f"{entry.name}.lock"


def _prune(entry, keep):
    """Delete everything in `entry` but the paths in `keep`."""
    keep = {entry / k for k in keep}
    for path in sorted(entry.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path in keep or any(k.is_relative_to(path) for k in keep):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def cached_build(kind, name, key, build, *, artifacts, keep=(), prune=True, what=None, quiet=False):
    """The directory of a build that is up to date, building it if needed.

    Parameters
    ----------
    kind, name : str
        Cache subdirectory and a readable name ("native", "chip16x16").
    key : sequence of str or bytes
        Everything the build depends on besides the tool versions (which are
        always part of the key): source digests, flags, configuration, and the
        paths and digests of the libraries it links at run time.
    build : callable(directory, status)
        Makes the artifacts in `directory`; calls ``status(phase)`` as it goes.
    artifacts : sequence of str
        Paths, relative to the entry, that later runs use; recorded with their
        size and SHA-256, and checked before every reuse.
    keep : sequence of str
        Other paths to keep (everything else is deleted after the build).
    prune : bool
        False keeps the whole build directory.
    what : str
        How the status line names the build.
    quiet : bool
        No status line: for a step of another build, which shows its own.
    """
    entry = cache_root() / kind / f"{name}-{content_hash(tool_versions(), *key)}"
    with _locked(_lock_path(entry)):
        reason = _stale_reason(entry, artifacts)
        if reason is None:
            os.utime(entry / META)
            return entry
        if reason != "absent":
            print(f"mxu: rebuilding {kind}/{entry.name}: {reason}", file=sys.stderr)
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(parents=True)
        if quiet:
            build(entry, lambda phase: None)
        else:
            started = time.monotonic()
            with BuildStatus(what or f"{kind} {name}", cache_root(),
                             expected=_last_build_seconds(entry.parent, name)) as status:
                build(entry, status)
            build_seconds = time.monotonic() - started
        if prune:
            _prune(entry, [*artifacts, *keep, "build.log"])
        record = {}
        for a in artifacts:
            path = entry / a
            if not path.exists():
                raise RuntimeError(f"the build of {kind}/{name} did not produce {a}; "
                                   f"see {entry / 'build.log'}")
            record[a] = {"size": path.stat().st_size, "sha256": _sha256(path),
                         "linked": _is_elf(path)}
        meta = {"kind": kind, "name": name, "created": time.time(), "artifacts": record,
                "tools": tool_versions()}
        if not quiet:
            meta["build_seconds"] = round(build_seconds, 1)
        tmp = entry / (META + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1))
        tmp.replace(entry / META)
    evict(protect=entry)
    return entry


def _size(path):
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def cache_entries(root=None):
    """Every build entry: dicts with path, kind, size, last use (seconds since
    the epoch) and whether it is complete."""
    root = Path(root) if root else cache_root()
    out = []
    for kind in sorted(p for p in root.iterdir() if p.is_dir()):
        for entry in sorted(p for p in kind.iterdir() if p.is_dir() and not p.name.startswith(".")):
            meta = entry / META
            used = (meta if meta.exists() else entry).stat().st_mtime
            out.append({"path": entry, "kind": kind.name, "size": _size(entry), "used": used,
                        "complete": meta.exists()})
    return out


def evict(limit=None, protect=None):
    """Delete least recently used entries until the cache is at most `limit`
    bytes (default `cache_limit()`); entries being built are skipped. Returns the
    deleted paths."""
    limit = cache_limit() if limit is None else limit
    entries = sorted(cache_entries(), key=lambda e: e["used"])
    total = sum(e["size"] for e in entries)
    deleted = []
    for e in entries:
        if total <= limit:
            break
        if protect is not None and e["path"] == Path(protect):
            continue
        with _locked(_lock_path(e["path"]), blocking=False) as free:
            if free:
                shutil.rmtree(e["path"], ignore_errors=True)
                total -= e["size"]
                deleted.append(e["path"])
    return deleted


def clear_cache():
    """Delete every entry that no process is building; returns the bytes freed."""
    freed = 0
    for e in cache_entries():
        with _locked(_lock_path(e["path"]), blocking=False) as free:
            if free:
                shutil.rmtree(e["path"], ignore_errors=True)
                freed += e["size"]
    return freed


@functools.cache
def _digest_cache(paths):
    return source_digest(*paths)
