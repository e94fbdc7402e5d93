// The DPI functions behind sim/backends/fast_pending.py: the compute engine's
// record of pending rows (`_PendingRows` in mxu/hdl/compute.py) as a C++
// model, register for register and cycle for cycle.
//
// The RTL compares the probe with every entry in every cycle (64 comparators
// of 13 bits, and one-hot masks that Verilator builds as 127-bit shifts):
// about a tenth of a simulated cycle. Here the comparison runs only in a cycle
// that loads the probe, over an array of addresses that the compiler turns
// into vector compares.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "svdpi.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace mxu {

struct PendingRows {
    int n, words;
    uint32_t addr_mask, count_mask;
    std::vector<uint32_t> entries;          // payloads: addr, last, push (the RTL's layout)
    std::vector<uint16_t> addrs;            // their addr fields, for the probe's compares
    std::vector<uint64_t> valid, match, eq;
    uint32_t wp = 0, rp = 0, rp1 = 0, count = 0, head = 0;
    bool full = false, hit = false;

    PendingRows(int depth, int addr_bits)
        : n(depth), words((depth + 63) / 64), addr_mask((1u << addr_bits) - 1),
          entries(depth), addrs((depth + 15) / 16 * 16), valid(words), match(words), eq(words) {
        int count_bits = 0;
        while ((1 << count_bits) <= depth) ++count_bits;     // Signal(range(depth + 1))
        count_mask = (1u << count_bits) - 1;
        reset();
    }

    void reset() {
        std::fill(entries.begin(), entries.end(), 0u);
        std::fill(addrs.begin(), addrs.end(), uint16_t(0));
        std::fill(valid.begin(), valid.end(), 0ull);
        std::fill(match.begin(), match.end(), 0ull);
        wp = rp = count = head = 0;
        rp1 = 1 % n;
        full = hit = false;
    }

    // Bit i of `eq` (word i / 64): entry i holds `probe`. Sixteen entries at a
    // time on SSE2: the scalar loop was a quarter of the model's time.
    void compare(uint32_t probe) {
#if defined(__SSE2__)
        const __m128i p = _mm_set1_epi16(short(probe));
        for (int w = 0; w < words; ++w) {
            const int base = w * 64, end = std::min(n, base + 64);
            uint64_t bits = 0;          // in a register: no store and reload per chunk
            for (int i = base; i < end; i += 16) {
                const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i *>(&addrs[i]));
                const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i *>(&addrs[i + 8]));
                const __m128i same = _mm_packs_epi16(_mm_cmpeq_epi16(lo, p), _mm_cmpeq_epi16(hi, p));
                bits |= uint64_t(uint32_t(_mm_movemask_epi8(same))) << (i - base);
            }
            eq[w] = bits;
        }
        if (n & 63) eq[words - 1] &= (1ull << (n & 63)) - 1;    // the padding's bits
#else
        std::fill(eq.begin(), eq.end(), 0ull);
        for (int i = 0; i < n; ++i) eq[i >> 6] |= uint64_t(addrs[i] == uint16_t(probe)) << (i & 63);
#endif
    }

    static uint64_t bit_in(uint32_t index, int w) {
        return int(index >> 6) == w ? 1ull << (index & 63) : 0ull;
    }

    void step(bool rst, bool add_valid, uint32_t payload, bool retire, uint32_t probe,
              bool probe_load) {
        if (rst) {
            reset();
            return;
        }
        const bool add = add_valid && !full;
        const uint32_t add_addr = payload & addr_mask;
        const bool add_eq = add_addr == probe;
        if (probe_load) compare(probe);
        bool any = false;
        for (int w = 0; w < words; ++w) {
            const uint64_t add_bits = add ? bit_in(wp, w) : 0ull;
            const uint64_t keep = retire ? ~bit_in(rp, w) : ~0ull;
            if (probe_load) {
                any |= (eq[w] & valid[w] & keep) != 0;
                match[w] = (eq[w] & ~add_bits) | (add_eq ? add_bits : 0ull);
            } else {
                any |= (match[w] & valid[w] & keep) != 0;
            }
            valid[w] = (valid[w] | add_bits) & keep;
        }
        hit = probe_load ? any || (add && add_eq) : any;
        if (retire)
            head = (add && wp == rp1) ? payload : entries[rp1];
        else if (add && count == 0)
            head = payload;
        if (add) {
            entries[wp] = payload;
            addrs[wp] = uint16_t(add_addr);
            wp = (wp + 1) & uint32_t(n - 1);
        }
        if (retire) {
            rp = rp1;
            rp1 = (rp1 + 1) & uint32_t(n - 1);
        }
        const int next = int(count) + int(add) - int(retire);
        count = uint32_t(next) & count_mask;
        full = next == n;
    }
};

}  // namespace mxu

extern "C" {

void *mxu_pending_new(int depth, int addr_bits) { return new mxu::PendingRows(depth, addr_bits); }

void mxu_pending_step(void *h, svBit rst, svBit add_valid, int add_payload, svBit retire,
                      int probe, svBit probe_load, int *head, svBit *add_ready, svBit *empty,
                      svBit *hit) {
    auto *p = static_cast<mxu::PendingRows *>(h);
    p->step(rst, add_valid, uint32_t(add_payload), retire, uint32_t(probe), probe_load);
    *head = int(p->head);
    *add_ready = !p->full;
    *empty = p->count == 0;
    *hit = p->hit;
}

}  // extern "C"
