// The DPI function behind sim/fast_pe.py: acc + a*w with a, w bf16 and acc fp32,
// each operation rounded to nearest-even in IEEE binary32 -- the golden model's
// NumPy float32 arithmetic -- and every NaN made the canonical 0x7FC00000.
// Compiled without -ffast-math; x86-64 uses SSE (no extended precision) and the
// default MXCSR keeps subnormals (no flush-to-zero).
#pragma once
#include <cstdint>
#include <cstring>

extern "C" unsigned int mxu_mac_f32(unsigned int a, unsigned int w, unsigned int acc) {
    uint32_t ab = a << 16, wb = w << 16;
    float fa, fw, facc;
    std::memcpy(&fa, &ab, 4);
    std::memcpy(&fw, &wb, 4);
    std::memcpy(&facc, &acc, 4);
    volatile float product = fa * fw;   // volatile: no contraction into an FMA
    float result = facc + product;
    uint32_t bits;
    std::memcpy(&bits, &result, 4);
    if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu)) bits = 0x7FC00000u;
    return bits;
}
