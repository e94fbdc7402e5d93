"""The ``mxu`` command line.

Each package adds its own commands: this module registers the runtime's, and
every entry point of the group ``mxu.commands`` (declared in pyproject.toml) adds
more -- the verification package the commands that check results against the
golden model (``demo``, ``matmul``, ``mac``), the synthesis package ``synth``
and ``export``. So the command line is one program while this package never
imports the packages above it (docs/architecture.md).
"""

import argparse
import sys
import time
from importlib.metadata import entry_points

from .driver.chip import ChipError

__all__ = ["main", "register", "positive_int", "nonnegative_int"]


def _int_flag(text, low, words):
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {words}, not {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be {words}, not {value}")
    return value


def positive_int(text):
    """argparse type: an integer >= 1 (the error names the flag)."""
    return _int_flag(text, 1, "a positive integer")


def nonnegative_int(text):
    """argparse type: an integer >= 0."""
    return _int_flag(text, 0, "an integer >= 0")


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def cmd_cache(args):
    from .backends.cache import cache_entries, cache_limit, cache_root, clear_cache
    from .report import format_table
    if args.clear:
        freed = clear_cache()
        print(f"cleared {cache_root()}: {_size(freed)} freed")
        return 0
    entries = cache_entries()
    total = sum(e["size"] for e in entries)
    print(f"build cache: {cache_root()} (set $MXU_CACHE to move it)")
    print(f"size: {_size(total)} in {len(entries)} builds; limit {_size(cache_limit())} "
          f"($MXU_CACHE_LIMIT), least recently used evicted first")
    print("clear it with `mxu cache --clear`")
    if args.info and entries:
        import time
        rows = [[e["kind"], e["path"].name, _size(e["size"]),
                 time.strftime("%Y-%m-%d %H:%M", time.localtime(e["used"])),
                 "yes" if e["complete"] else "no (unfinished)"]
                for e in sorted(entries, key=lambda e: -e["used"])]
        print(format_table(["kind", "build", "size", "last used", "complete"], rows))
    return 0


def embed_texts(texts, config, rtl=False, out=None):
    """Embed `texts` with all-MiniLM-L6-v2 on a simulated chip; print the cosine
    similarity matrix and the statistics. Returns the embeddings."""
    import numpy as np
    from .models import SentenceEncoder
    from .report import format_table
    from .runtime.chip import Chip
    out = out or sys.stdout
    start = time.perf_counter()
    encoder = SentenceEncoder("all-MiniLM-L6-v2", chip=Chip(config, fast_mac=not rtl))
    loaded = time.perf_counter() - start
    emb = encoder.encode(list(texts))
    s = encoder.last_stats
    sims = emb @ emb.T
    names = [f"[{i}]" for i in range(len(texts))]
    for i, t in enumerate(texts):
        print(f"[{i}] {t}", file=out)
    print(format_table([""] + names, [[n] + [f"{v:.4f}" for v in row] for n, row in zip(names, sims)]),
          file=out)
    tokens = sum(len(t) for t in encoder.tokenize(texts))
    rows = [
        ["model", f"all-MiniLM-L6-v2 on a {config.rows}x{config.cols} chip, "
                  f"{'RTL' if rtl else 'fast MAC'} PEs (model load {loaded:.1f} s)"],
        ["tokens", f"{tokens:,}"],
        ["model GMACs", f"{s.model_macs / 1e9:.3f} ({s.macs / 1e9:.3f} with padding)"],
        ["chip cycles", f"{s.cycles:,} in {s.programs} programs ({s.cache_hits} from the cache)"],
        ["utilization", f"{100 * s.utilization:.1f} % (MFU {100 * s.mfu:.1f} %)"],
        ["simulated MAC/s", f"{s.macs / s.sim_seconds / 1e6:,.1f} M" if s.sim_seconds else "-"],
        ["wall seconds", f"{s.wall_seconds:.2f} ({s.sim_seconds:.2f} simulation, "
                         f"{s.host_seconds:.2f} host)"],
    ]
    print(format_table(["", "mxu embed"], rows), file=out)
    return emb


def cmd_embed(args):
    from mxu.hdl import ChipConfig
    embed_texts(args.texts, ChipConfig(rows=args.rows, cols=args.cols), rtl=args.rtl)
    return 0


def register(sub):
    """Add the runtime's own commands to the subcommand parser `sub`."""
    from mxu.hdl import ChipConfig
    embed = sub.add_parser("embed", help="embed texts with all-MiniLM-L6-v2 on the simulated chip")
    embed.add_argument("texts", nargs="+", help="the texts to embed")
    embed.add_argument("--rows", type=positive_int, default=ChipConfig().rows,
                       help="systolic array rows")
    embed.add_argument("--cols", type=positive_int, default=ChipConfig().cols,
                       help="systolic array columns")
    embed.add_argument("--rtl", action="store_true",
                       help="all-RTL PEs instead of the fast MAC model (same results, slower)")
    embed.set_defaults(func=cmd_embed)
    cache = sub.add_parser("cache", help="show or clear the simulator build cache")
    group = cache.add_mutually_exclusive_group()
    group.add_argument("--info", action="store_true",
                       help="list every cached build with its size and last use")
    group.add_argument("--clear", action="store_true",
                       help="delete every cached build (they are rebuilt when needed)")
    cache.set_defaults(func=cmd_cache)


def _plugins():
    return sorted(entry_points(group="mxu.commands"), key=lambda ep: ep.name)


def build_parser():
    parser = argparse.ArgumentParser(prog="mxu", description="mxu: a bf16/fp32 matrix unit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    for ep in _plugins():
        ep.load()(sub)
    register(sub)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, ChipError) as error:
        print(f"mxu {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"mxu {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
