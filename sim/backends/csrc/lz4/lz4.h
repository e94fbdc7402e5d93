// A stand-in for the two LZ4 functions that Verilator's FST writer calls, so
// that FST waveforms need no LZ4 development package from the OS (only zlib).
// It writes valid LZ4 blocks that hold the input as literals only: the FST
// writer uses LZ4 for the signal hierarchy, which must be LZ4, and for value
// data, where it keeps the smaller of the compressed and raw forms (so raw).
// Value changes are still zlib-compressed where the writer chooses zlib.
#pragma once
#include <cstring>

static inline int LZ4_compressBound(int n) { return n + n / 255 + 16; }

static inline int LZ4_compress_default(const char *src, char *dst, int n, int capacity) {
    if (n < 0 || capacity < LZ4_compressBound(n)) return 0;
    char *out = dst;
    // One last sequence: a token, the literal length, the literals, no match.
    *out++ = (char)((n < 15 ? n : 15) << 4);
    if (n >= 15) {
        int rest = n - 15;
        for (; rest >= 255; rest -= 255) *out++ = (char)255;
        *out++ = (char)rest;
    }
    std::memcpy(out, src, n);
    return (int)(out - dst) + n;
}
