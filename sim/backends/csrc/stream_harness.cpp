// Streams a vector of input payloads through a Verilated component with ports
// i__payload/i__valid/i__ready and o__payload/o__valid/o__ready, collecting one
// output payload per input. The whole loop runs in C++: Python only hands over
// the arrays (docs/simulation.md).
#include <cstdint>
#include "Vtop.h"
#include "verilated.h"

// Verilator escapes "__" in port names as "___05F".

namespace {
// xorshift64: a cheap, seeded source of random back-pressure.
inline uint64_t next_random(uint64_t &s) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s;
}
}

extern "C" {

// Returns the number of clock cycles, or -1 if `max_cycles` passed first (the
// watchdog: a stuck design never hangs the caller). ready_percent < 100 drops
// o__ready at random to exercise stalls.
int64_t mxu_stream_run(uint64_t n, const uint64_t *in, uint64_t *out,
                       uint32_t ready_percent, uint64_t seed, uint64_t max_cycles) {
    VerilatedContext ctx;
    Vtop top(&ctx);
    uint64_t rng = seed ? seed : 0x9E3779B97F4A7C15ull;
    top.clk = 0; top.rst = 1; top.i___05Fvalid = 0; top.o___05Fready = 0;
    for (int i = 0; i < 2; i++) { top.clk = 0; top.eval(); top.clk = 1; top.eval(); }
    top.rst = 0;
    uint64_t sent = 0, received = 0, cycles = 0;
    while (received < n) {
        if (cycles++ >= max_cycles) return -1;
        top.clk = 0;
        top.i___05Fvalid = sent < n;
        top.i___05Fpayload = sent < n ? in[sent] : 0;
        top.o___05Fready = ready_percent >= 100 || (next_random(rng) % 100) < ready_percent;
        top.eval();
        const bool take_in = top.i___05Fvalid && top.i___05Fready;
        if (top.o___05Fvalid && top.o___05Fready) out[received++] = top.o___05Fpayload;
        top.clk = 1;
        top.eval();
        if (take_in) sent++;
    }
    top.final();
    return (int64_t)cycles;
}

}
