"""Fused epilogues against the unfused program, op by op, on the ops of one
MiniLM-sized encoder layer (128 tokens, hidden 384, 12 heads, FFN 1536) on
``ChipConfig.preset("vpu")`` with the fast MAC and lanes.

    .venv/bin/python bench/epilogue.py [--banks 2,4]

For each op: the array's ideal cycles (MACs / PEs), the cycles with the layer
op fused onto the matmul (``Chip.matmul(..., then=kind)``) and unfused (the
matmul into an fp32 tensor, then ``Chip.vector``), and the vector unit's busy
rows. The same bits either way (tests/test_sim_epilogue.py). The last row is
the whole layer program as the encoder records it.
"""

import argparse
import math

import numpy as np

from mxu.hdl import ChipConfig
from mxu.hdl.dtypes import bfloat16
from mxu.sim import Chip
from mxu.sim.report import Results
from mxu.sim.models.encoder import ChipEncoderLayer, EncoderConfig, LayerWeights
from mxu.sim.runtime.vector import layer_norm_params, softmax_bias

L, H, HEADS, FFN = 128, 384, 12, 1536


class Layer:
    """A layer's tensors on `chip` and its fused ops, fused or not."""

    def __init__(self, chip, rng):
        self.chip = chip
        up = lambda shape, dtype=np.float32: chip.upload(
            rng.standard_normal(shape).astype(np.float32), dtype=dtype)
        self.x, self.xb = up((L, H)), up((L, H), bfloat16)
        self.w = {name: up(shape, bfloat16) for name, shape in
                  (("k", (H, H)), ("o", (H, H)), ("up", (H, FFN)), ("down", (FFN, H)))}
        self.b = {name: up((shape[1],)) for name, shape in
                  (("k", (H, H)), ("o", (H, H)), ("up", (H, FFN)), ("down", (FFN, H)))}
        self.q, self.kt = up((L, H), bfloat16), up((H, L), bfloat16)
        self.hb, self.ctx = up((L, FFN), bfloat16), up((L, H), bfloat16)
        self.bias = softmax_bias(chip, np.ones((1, L), bool))
        self.ln = layer_norm_params(chip, np.ones(H, np.float32), np.zeros(H, np.float32))

    def ops(self):
        """(name, MACs, [(A, B, bias, out shape, out dtype, kind, operands)])."""
        d = H // HEADS
        heads = [(self.q[:, h * d:(h + 1) * d], self.kt[h * d:(h + 1) * d], None, (L, L),
                  bfloat16, "softmax", dict(other=self.bias)) for h in range(HEADS)]
        ln = dict(other=self.x, params=self.ln, eps=1e-12)
        return [
            ("K^T (transpose)", L * H * H,
             [(self.xb, self.w["k"], self.b["k"], (H, L), bfloat16, "transpose",
               dict(scale=1 / math.sqrt(d)))]),
            ("scores (softmax) x12", HEADS * L * L * d, heads),
            ("projection (add + LN)", L * H * H,
             [(self.ctx, self.w["o"], self.b["o"], (L, H), np.float32, "add_layer_norm", ln)]),
            ("FFN up (GELU)", L * H * FFN,
             [(self.xb, self.w["up"], self.b["up"], (L, FFN), bfloat16, "gelu", {})]),
            ("FFN down (add + LN)", L * H * FFN,
             [(self.hb, self.w["down"], self.b["down"], (L, H), np.float32, "add_layer_norm", ln)]),
        ]

    def run(self, calls, fused):
        chip = self.chip
        with chip.record() as rec:
            for A, B, bias, shape, dtype, kind, operands in calls:
                out = chip.empty(shape, dtype)
                if fused:
                    chip.matmul(A, B, bias=bias, out=out, then=kind, **operands)
                    continue
                r = chip.matmul(A, B, bias=bias, keep=True)
                vector = dict(operands)
                if kind == "transpose":
                    chip.vector("copy", r, out_t=out, **vector)
                    continue
                if kind == "softmax":
                    vector["group"] = r.shape[0]
                target = "out" if dtype == np.float32 else "out_bf16"
                chip.vector(kind, r, **{target: out}, **vector)
        return rec.stats


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--banks", default="4", help="comma-separated accumulator bank counts")
    args = parser.parse_args()
    rows = []
    for banks in (int(b) for b in args.banks.split(",")):
        chip = Chip(ChipConfig.preset("vpu").replace(acc_banks=banks), fast_mac=True)
        layer = Layer(chip, np.random.default_rng(0))
        pes = chip.config.rows * chip.config.cols
        for name, macs, calls in layer.ops():
            fused, unfused = layer.run(calls, True), layer.run(calls, False)
            rows.append([name, banks, f"{macs // pes:,}", f"{fused.cycles:,}",
                         f"{unfused.cycles:,}", f"{100 * macs / pes / fused.cycles:.1f} %",
                         f"{fused.vector_active_cycles:,}"])
        cfg = EncoderConfig(H, HEADS, FFN, 1)
        encoder_layer = ChipEncoderLayer(chip, cfg, LayerWeights.random(cfg, np.random.default_rng(1)))
        _, _, stats = encoder_layer(layer.x, layer.xb, layer.bias, 1, L, unmasked={0})
        macs = L * (4 * H * H + 2 * H * FFN) + 2 * L * L * H
        rows.append(["whole layer (one program)", banks, f"{macs // pes:,}", f"{stats.cycles:,}",
                     "--", f"{100 * macs / pes / stats.cycles:.1f} %",
                     f"{stats.vector_active_cycles:,}"])
    results = Results("epilogue")
    results.table("Fused epilogues on one MiniLM-sized layer (16x16, fast MAC and lanes)",
                  ["op", "acc banks", "array ideal", "fused cycles", "unfused cycles",
                   "MFU fused", "VPU rows"], rows)
    results.write()


if __name__ == "__main__":
    main()
