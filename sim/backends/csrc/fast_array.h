// The DPI functions behind sim/backends/fast_array.py: the systolic array's
// datapath (PE grid, skews, weight bus) as one C++ model with the behaviour of
// `mxu.hdl.array.datapath_signature`, cycle for cycle.
//
// A beat taken on `take` is computed at once -- the sequential fp32 dot product
// seed[j] + a[0]*W[0][j] + ... + a[rows-1]*W[rows-1][j], each product and sum
// rounded to nearest-even in IEEE binary32 (x86-64 SSE, no fast-math, no FMA
// contraction; the golden model's NumPy float32 order) -- and comes out of a
// delay line `latency` enabled cycles later. A NaN anywhere in the chain stays a
// NaN to its end, so making the final NaN canonical equals the RTL's canonical
// NaN after every step.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "svdpi.h"

namespace mxu {

struct FastArray {
    int rows, cols, latency, weight_rows;
    int tile_fill = 0;                         // rows of the tile being taken so far
    std::vector<float> tile;                   // active weights, rows x cols
    std::vector<float> staged;                 // weight rows taken; those from
    size_t staged_head = 0;                    // staged_head on are not yet claimed
    std::vector<uint32_t> slots;               // delay line: latency x cols results
    std::vector<uint8_t> valid;                // latency valid bits
    std::vector<float> acc;                    // the sums of the beat being computed
    int newest = 0, in_flight = 0;

    FastArray(int r, int c, int l, int w)
        : rows(r), cols(c), latency(l), weight_rows(w), tile(r * c), slots(l * c), valid(l),
          acc(c) {}

    void reset() {
        std::fill(tile.begin(), tile.end(), 0.0f);
        staged.clear();
        staged_head = 0;
        tile_fill = 0;
        std::fill(slots.begin(), slots.end(), 0u);
        std::fill(valid.begin(), valid.end(), 0);
        newest = 0;
        in_flight = 0;
    }

    static float bf16(uint32_t bits) {
        uint32_t w = bits << 16;
        float f;
        std::memcpy(&f, &w, 4);
        return f;
    }

    static uint32_t field(const svBitVecVal *v, int index, int width) {
        int bit = index * width;
        return (v[bit / 32] >> (bit % 32)) & ((1u << width) - 1u);
    }

    // Rows are appended to one buffer and claimed from its front, which moves
    // back to the start once claimed rows are the larger part: no allocation
    // per row once the buffer has grown to the rows a stream keeps staged.
    // A beat holds `weight_rows` rows; those past a tile's last row (in the
    // tile's last beat) are padding.
    void take_weight(const svBitVecVal *w) {
        const int n = std::min(weight_rows, rows - tile_fill);
        tile_fill = tile_fill + n == rows ? 0 : tile_fill + n;
        const size_t at = staged.size();
        staged.resize(at + n * cols);
        for (int j = 0; j < n * cols; j++) staged[at + j] = bf16(field(w, j, 16));
    }

    void claim_tile() {
        for (int k = 0; k < rows; k++) {
            // Admission makes a whole tile staged first; anything else would be
            // a broken array protocol, which the RTL would not survive either.
            if (staged_head == staged.size()) break;
            copy_words(reinterpret_cast<uint32_t *>(&tile[k * cols]),
                       reinterpret_cast<const uint32_t *>(&staged[staged_head]), cols);
            staged_head += cols;
        }
        if (2 * staged_head >= staged.size()) {
            staged.erase(staged.begin(), staged.begin() + staged_head);
            staged_head = 0;
        }
    }

    // A row of words: a copy of constant size for the usual widths (a few
    // moves, not a call of the C library's memcpy each cycle). The arms must
    // differ: clang merges a switch of memcpy calls into one call of a looked-up size.
    template <int N>
    static void copy_n(uint32_t *to, const uint32_t *from) {
        typedef uint32_t v4u __attribute__((vector_size(16), aligned(4), may_alias));
        for (int i = 0; i < N; i += 4)
            *reinterpret_cast<v4u *>(to + i) = *reinterpret_cast<const v4u *>(from + i);
    }

    static void copy_words(uint32_t *to, const uint32_t *from, int n) {
        switch (n) {
        case 4: return copy_n<4>(to, from);
        case 8: return copy_n<8>(to, from);
        case 16: return copy_n<16>(to, from);
        case 32: return copy_n<32>(to, from);
        }
        std::memcpy(to, from, n * sizeof(uint32_t));
    }

    // Four columns at a time in SSE registers (x86-64's baseline): mulps and
    // addps round each lane exactly as mulss and addss do, so the sums are the
    // scalar loop's bits; 16 columns are four independent chains of adds.
    typedef float v4sf __attribute__((vector_size(16)));

    template <int C>
    __attribute__((optimize("fp-contract=off")))
    void compute_cols(const svBitVecVal *act, const svBitVecVal *seed, uint32_t *out) {
        v4sf sum[C / 4];
        std::memcpy(sum, seed, sizeof sum);
        for (int k = 0; k < rows; k++) {
            const float a = bf16(field(act, k, 16));
            const v4sf av = {a, a, a, a};
            v4sf w[C / 4];
            std::memcpy(w, &tile[k * C], sizeof w);
            for (int j = 0; j < C / 4; j++) sum[j] = sum[j] + av * w[j];
        }
        std::memcpy(out, sum, sizeof sum);
        canonical_nans(out);
    }

    __attribute__((optimize("fp-contract=off")))
    void compute(const svBitVecVal *act, const svBitVecVal *seed, uint32_t *out) {
        switch (cols) {
        case 4: return compute_cols<4>(act, seed, out);
        case 8: return compute_cols<8>(act, seed, out);
        case 16: return compute_cols<16>(act, seed, out);
        case 32: return compute_cols<32>(act, seed, out);
        }
        std::memcpy(acc.data(), seed, cols * sizeof(float));
        for (int k = 0; k < rows; k++) {
            const float a = bf16(field(act, k, 16));
            const float *w = &tile[k * cols];
            for (int j = 0; j < cols; j++) {
                const float product = a * w[j];
                acc[j] = acc[j] + product;
            }
        }
        std::memcpy(out, acc.data(), cols * sizeof(float));
        canonical_nans(out);
    }

    void canonical_nans(uint32_t *out) const {
        for (int j = 0; j < cols; j++)
            if ((out[j] & 0x7F800000u) == 0x7F800000u && (out[j] & 0x007FFFFFu)) out[j] = 0x7FC00000u;
    }

    // The delay line's slot after `slot` (a compare, not a division each cycle).
    int next_slot(int slot) const { return slot + 1 == latency ? 0 : slot + 1; }

    // One rising clock edge; writes the registered outputs after it.
    void step(bool rst, bool en, bool take, bool first, const svBitVecVal *act,
              const svBitVecVal *seed, bool weight_take, const svBitVecVal *weight,
              svBitVecVal *result, svBit *result_valid) {
        if (rst) {
            reset();
        } else {
            if (weight_take) take_weight(weight);
            if (en && (take || in_flight)) {
                int oldest = next_slot(newest);
                in_flight -= valid[oldest];
                newest = oldest;
                valid[newest] = take;
                if (take) {
                    if (first) claim_tile();
                    compute(act, seed, &slots[newest * cols]);
                    in_flight++;
                }
            }
        }
        int out = next_slot(newest);
        copy_words(result, &slots[out * cols], cols);
        *result_valid = valid[out];
    }
};

}  // namespace mxu

extern "C" {

void *mxu_array_new(int rows, int cols, int latency, int weight_rows) {
    return new mxu::FastArray(rows, cols, latency, weight_rows);
}

void mxu_array_step(void *h, svBit rst, svBit en, svBit take, svBit first,
                    const svBitVecVal *act, const svBitVecVal *seed, svBit weight_take,
                    const svBitVecVal *weight, svBitVecVal *result, svBit *result_valid) {
    static_cast<mxu::FastArray *>(h)->step(rst, en, take, first, act, seed, weight_take, weight,
                                           result, result_valid);
}

}  // extern "C"
