// Native runner for mxu.hdl.dma.DmaSystem (DMA + VMEM + accumulator memory)
// next to the AxiMem external-memory model. Python (sim/dma.py) drives it
// through ctypes: it fills the external memory directly, hands over a list of
// descriptors, and the whole run -- descriptor issue, AXI traffic, completions,
// optional array-side memory traffic -- happens here in C++.
#include <cstdint>
#include <cstring>
#include <memory>

#include "Vtop.h"
#include "verilated.h"
#include "axi_mem.h"

namespace {

constexpr int MAXW = 64;   // words of the widest port we copy (cmd payload, rows)

struct Dut {
    VerilatedContext ctx;
    std::unique_ptr<Vtop> top;
    mxu::AxiMem mem;
    mxu::AxiPins pins;
    uint64_t cycles = 0;
    Dut(uint64_t bytes, uint32_t data_bytes) : mem(bytes, data_bytes) {
        top.reset(new Vtop(&ctx));
    }
};

// One clock cycle: slave outputs, falling-edge eval, handshakes, rising edge.
// `pre` sets the harness-driven inputs; `post` samples the handshakes.
template <class Pre, class Post> void step(Dut &d, Pre pre, Post post) {
    Vtop &t = *d.top;
    d.mem.drive(d.pins);
    MXU_AXI_DRIVE(t, axi___05F, d.pins);
    pre(t);
    t.clk = 0;
    t.eval();
    MXU_AXI_SAMPLE(t, axi___05F, d.pins);
    post(t);
    d.mem.update(d.pins);
    t.clk = 1;
    t.eval();
    d.cycles++;
}

void idle_inputs(Vtop &t) {
    t.cmd___05Fvalid = 0;
    t.done___05Fready = 0;
    t.vmem_rd___05Fvalid = 0;
    t.acc_rd___05Fvalid = 0;
    t.acc_wr___05Fvalid = 0;
    t.vmem_rd_data___05Fready = 1;
    t.acc_rd_data___05Fready = 1;
}

}  // namespace

extern "C" {

void *mxu_dma_new(uint64_t mem_bytes, uint32_t data_bytes) {
    Dut *d = new Dut(mem_bytes, data_bytes);
    Vtop &t = *d->top;
    idle_inputs(t);
    t.rst = 1;
    for (int i = 0; i < 4; i++) step(*d, [](Vtop &) {}, [](Vtop &) {});
    t.rst = 0;
    return d;
}

void mxu_dma_free(void *h) { delete static_cast<Dut *>(h); }

uint8_t *mxu_dma_mem(void *h) { return static_cast<Dut *>(h)->mem.mem.data(); }

void mxu_dma_params(void *h, uint32_t lat_min, uint32_t lat_max, const uint32_t *pause5,
                    uint32_t max_reads, uint32_t max_writes, uint64_t seed) {
    mxu::AxiMemParams p;
    p.lat_min = lat_min;
    p.lat_max = lat_max;
    for (int i = 0; i < 5; i++) p.pause_pct[i] = pause5[i];
    p.max_reads = max_reads;
    p.max_writes = max_writes;
    p.seed = seed;
    static_cast<Dut *>(h)->mem.set_params(p);
}

void mxu_dma_add_error(void *h, uint64_t lo, uint64_t hi, uint32_t resp) {
    static_cast<Dut *>(h)->mem.add_error(lo, hi, resp);
}

void mxu_dma_clear_errors(void *h) { static_cast<Dut *>(h)->mem.clear_errors(); }

// stats[0..10]: cycles, ar bursts, aw bursts, r beats, w beats, max reads in flight,
// max writes in flight, violations, r error beats, b errors, memory busy
const char *mxu_dma_stats(void *h, uint64_t *stats) {
    Dut &d = *static_cast<Dut *>(h);
    const mxu::AxiMem &m = d.mem;
    uint64_t s[] = {d.cycles, m.ar_bursts, m.aw_bursts, m.r_beats, m.w_beats, m.max_reads_seen,
                    m.max_writes_seen, m.violations, m.r_errors, m.b_errors, m.busy()};
    std::memcpy(stats, s, sizeof s);
    return m.first_violation.c_str();
}

// Run `n` descriptors (each `words` 32-bit words, little-endian) back to back and
// write one completion word per descriptor into `done`. With bit 0 of
// `array_traffic`, the array's read ports read consecutive VMEM and accumulator
// rows every cycle; with bit 1, the array's result port writes zero rows into
// the last two accumulator rows every cycle (bank-conflict traffic). Returns the cycles from the first descriptor offered
// to the last completion taken, or -1 if `max_cycles` passed first (watchdog).
int64_t mxu_dma_run(void *h, uint32_t n, const uint32_t *desc, uint32_t words, uint32_t *done,
                    uint32_t array_traffic, uint32_t vmem_rows, uint32_t acc_rows,
                    uint64_t max_cycles) {
    Dut &d = *static_cast<Dut *>(h);
    uint32_t sent = 0, got = 0;
    uint64_t start = d.cycles, t = 0;
    uint32_t w[MAXW] = {};
    while (got < n) {
        if (t++ >= max_cycles) return -1;
        bool take_cmd = false, take_done = false;
        step(d,
             [&](Vtop &top) {
                 idle_inputs(top);
                 if (sent < n) {
                     std::memset(w, 0, sizeof w);
                     std::memcpy(w, desc + (uint64_t)sent * words, words * 4);
                     mxu::from_words(top.cmd___05Fpayload, w);
                     top.cmd___05Fvalid = 1;
                 }
                 top.done___05Fready = 1;
                 if (array_traffic & 1) {
                     top.vmem_rd___05Fvalid = 1;
                     top.vmem_rd___05Fpayload = (uint32_t)(d.cycles % vmem_rows);
                     top.acc_rd___05Fvalid = 1;
                     top.acc_rd___05Fpayload = (uint32_t)(d.cycles % acc_rows);
                 }
                 if (array_traffic & 2) {
                     // zero rows into the last two accumulator rows (both banks)
                     uint32_t aw[MAXW] = {};
                     aw[0] = acc_rows - 1 - (uint32_t)(d.cycles % 2);
                     top.acc_wr___05Fvalid = 1;
                     mxu::from_words(top.acc_wr___05Fpayload, aw);
                 }
             },
             [&](Vtop &top) {
                 take_cmd = top.cmd___05Fvalid && top.cmd___05Fready;
                 take_done = top.done___05Fvalid && top.done___05Fready;
                 if (take_done) done[got] = top.done___05Fpayload;
             });
        if (take_cmd) sent++;
        if (take_done) got++;
    }
    // Leave the inputs idle for the next call.
    step(d, [](Vtop &top) { idle_inputs(top); }, [](Vtop &) {});
    return (int64_t)(d.cycles - 1 - start);
}

// Read `n` rows from `row` on through the array's VMEM (space 0) or accumulator
// (space 1) read port; each row is `words` words in `out`.
void mxu_dma_read_rows(void *h, uint32_t space, uint32_t row, uint32_t n, uint32_t words,
                       uint32_t *out) {
    Dut &d = *static_cast<Dut *>(h);
    uint32_t w[MAXW];
    for (uint32_t i = 0; i <= n; i++) {
        step(d,
             [&](Vtop &top) {
                 idle_inputs(top);
                 if (i < n) {
                     if (space == 0) { top.vmem_rd___05Fvalid = 1; top.vmem_rd___05Fpayload = row + i; }
                     else { top.acc_rd___05Fvalid = 1; top.acc_rd___05Fpayload = row + i; }
                 }
             },
             [&](Vtop &top) {
                 if (i == 0) return;
                 if (space == 0) mxu::to_words(top.vmem_rd_data___05Fpayload, w);
                 else mxu::to_words(top.acc_rd_data___05Fpayload, w);
                 std::memcpy(out + (uint64_t)(i - 1) * words, w, words * 4);
             });
    }
}

// Write `n` accumulator rows through the array's result port; `payloads` holds
// `n` RowWrite payloads (row address in the low bits, then the row), packed by
// the caller, `words` words each.
void mxu_dma_write_acc(void *h, uint32_t n, uint32_t words, const uint32_t *payloads) {
    Dut &d = *static_cast<Dut *>(h);
    uint32_t w[MAXW] = {};
    for (uint32_t i = 0; i < n; i++) {
        std::memcpy(w, payloads + (uint64_t)i * words, words * 4);
        step(d,
             [&](Vtop &top) {
                 idle_inputs(top);
                 top.acc_wr___05Fvalid = 1;
                 mxu::from_words(top.acc_wr___05Fpayload, w);
             },
             [](Vtop &) {});
    }
}

}
