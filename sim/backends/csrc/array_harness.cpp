// Streams weight tiles, activation rows and seeds through a Verilated
// SystolicArray (module `top`, ports act__*, seed__*, weight__*, result__*) and
// collects one result row per activation row. The whole loop runs in C++:
// Python hands over packed arrays and gets packed arrays back (docs/simulation.md).
//
// Payloads are little-endian arrays of 32-bit words, `*_words` words per beat,
// laid out exactly as the Verilog port (bit 0 of word 0 is bit 0 of the port).
#include <cstddef>
#include <cstdint>
#include "Vtop.h"
#include "verilated.h"
#include "fast_array.h"

// Verilator escapes "__" in port names as "___05F".

namespace {

// xorshift64: a cheap, seeded source of random valid/ready patterns.
inline uint64_t next_random(uint64_t &s) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s;
}

inline bool chance(uint64_t &rng, uint32_t percent) {
    return percent >= 100 || (next_random(rng) % 100) < percent;
}

// Port access for every width class Verilator uses (CData..QData, VlWide).
template <std::size_t N> inline void put(VlWide<N> &port, const uint32_t *w) {
    for (std::size_t i = 0; i < N; i++) port[i] = w[i];
}
inline void put(CData &port, const uint32_t *w) { port = (CData)w[0]; }
inline void put(SData &port, const uint32_t *w) { port = (SData)w[0]; }
inline void put(IData &port, const uint32_t *w) { port = w[0]; }
inline void put(QData &port, const uint32_t *w) { port = (QData)w[0] | ((QData)w[1] << 32); }

template <std::size_t N> inline void get(const VlWide<N> &port, uint32_t *w) {
    for (std::size_t i = 0; i < N; i++) w[i] = port[i];
}
inline void get(IData port, uint32_t *w) { w[0] = port; }
inline void get(QData port, uint32_t *w) { w[0] = (uint32_t)port; w[1] = (uint32_t)(port >> 32); }

}  // namespace

extern "C" {

// Layout of `stats` (int64_t[8]), filled on return.
enum {
    STAT_TOTAL_CYCLES = 0,   // cycles simulated after reset
    STAT_FIRST_IN = 1,       // cycle of the first accepted activation beat
    STAT_LAST_OUT = 2,       // cycle of the last accepted result beat
    STAT_ACT_WAIT = 3,       // cycles with act.valid high and act.ready low
    STAT_WEIGHT_WAIT = 4,    // cycles with weight.valid high and weight.ready low
    STAT_OUT_STALL = 5,      // cycles with result.valid high and result.ready low
    STAT_COUNT = 8,
};

// Returns last_out - first_in + 1 (the cycle contract's measure), or
//   -1 if `max_cycles` passed first (watchdog: a stuck design never hangs),
//   -2 if act and seed were accepted in different cycles (lockstep broken),
//   -3 if a result came out with no activation beat outstanding.
// act_valid_percent / seed_valid_percent / weight_valid_percent < 100 offer
// beats at random (an offered beat stays valid until accepted, as the stream
// rules require); ready_percent < 100 drops result.ready at random.
int64_t mxu_array_run(uint64_t n, const uint32_t *act, const uint32_t *seed,
                      uint64_t n_weight, const uint32_t *weight, uint32_t *out,
                      uint32_t act_words, uint32_t seed_words, uint32_t weight_words,
                      uint32_t out_words,
                      uint32_t act_valid_percent, uint32_t seed_valid_percent,
                      uint32_t weight_valid_percent, uint32_t ready_percent,
                      uint64_t rng_seed, uint64_t max_cycles, int64_t *stats) {
    VerilatedContext ctx;
    Vtop top(&ctx);
    uint64_t rng = rng_seed ? rng_seed : 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < STAT_COUNT; i++) stats[i] = 0;
    stats[STAT_FIRST_IN] = -1;

    top.clk = 0; top.rst = 1;
    top.act___05Fvalid = 0; top.seed___05Fvalid = 0; top.weight___05Fvalid = 0;
    top.result___05Fready = 0;
    for (int i = 0; i < 2; i++) { top.clk = 0; top.eval(); top.clk = 1; top.eval(); }
    top.rst = 0;

    uint64_t a_sent = 0, s_sent = 0, w_sent = 0, received = 0, cycle = 0;
    bool a_offer = false, s_offer = false, w_offer = false;
    int64_t status = 0;
    while (received < n) {
        if (cycle >= max_cycles) { status = -1; break; }
        top.clk = 0;
        if (!a_offer && a_sent < n) a_offer = chance(rng, act_valid_percent);
        if (!s_offer && s_sent < n) s_offer = chance(rng, seed_valid_percent);
        if (!w_offer && w_sent < n_weight) w_offer = chance(rng, weight_valid_percent);
        top.act___05Fvalid = a_offer;
        top.seed___05Fvalid = s_offer;
        top.weight___05Fvalid = w_offer;
        if (a_sent < n) put(top.act___05Fpayload, act + a_sent * act_words);
        if (s_sent < n) put(top.seed___05Fpayload, seed + s_sent * seed_words);
        if (w_sent < n_weight) put(top.weight___05Fpayload, weight + w_sent * weight_words);
        top.result___05Fready = chance(rng, ready_percent);
        top.eval();

        const bool a_fire = top.act___05Fvalid && top.act___05Fready;
        const bool s_fire = top.seed___05Fvalid && top.seed___05Fready;
        const bool w_fire = top.weight___05Fvalid && top.weight___05Fready;
        const bool o_fire = top.result___05Fvalid && top.result___05Fready;
        if (a_fire != s_fire) { status = -2; break; }
        if (top.act___05Fvalid && !top.act___05Fready) stats[STAT_ACT_WAIT]++;
        if (top.weight___05Fvalid && !top.weight___05Fready) stats[STAT_WEIGHT_WAIT]++;
        if (top.result___05Fvalid && !top.result___05Fready) stats[STAT_OUT_STALL]++;
        if (a_fire && stats[STAT_FIRST_IN] < 0) stats[STAT_FIRST_IN] = (int64_t)cycle;
        if (o_fire) {
            if (received >= a_sent) { status = -3; break; }
            get(top.result___05Fpayload, out + received * out_words);
            received++;
            stats[STAT_LAST_OUT] = (int64_t)cycle;
        }
        top.clk = 1;
        top.eval();
        if (a_fire) { a_sent++; a_offer = false; }
        if (s_fire) { s_sent++; s_offer = false; }
        if (w_fire) { w_sent++; w_offer = false; }
        cycle++;
    }
    stats[STAT_TOTAL_CYCLES] = (int64_t)cycle;
    top.final();
    if (status < 0) return status;
    return stats[STAT_LAST_OUT] - stats[STAT_FIRST_IN] + 1;
}

}
