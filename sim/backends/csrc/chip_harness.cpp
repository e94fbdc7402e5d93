// Native runner for mxu.hdl.top.MxuChip next to the AxiMem external-memory model
// (docs/simulation.md). Python (sim/driver/chip.py) fills the memory through a
// pointer, writes registers, and calls mxu_chip_run_for, which clocks the chip in
// C++ until it raises irq or a cycle budget is spent. Python calls it in slices of
// about 0.1 s, so that Ctrl-C and the watchdog act between slices.
#include <cstdint>
#if defined(MXU_THREADS) && defined(__GLIBC__)
#include <malloc.h>
#endif
#include <memory>
#include <vector>

#include "Vtop.h"
#include "Vtop__Syms.h"
#include "verilated.h"
#include "axi_mem.h"
#include "fast_array.h"
#include "fast_pending.h"
#include "link_model.h"
#if VM_TRACE_FST
#include "verilated_fst_c.h"
typedef VerilatedFstC TraceFile;
#elif VM_TRACE
#include "verilated_vcd_c.h"
typedef VerilatedVcdC TraceFile;
#endif

// Verilator's generated evaluation of one timestep (Vtop.cpp declares it the same way).
void Vtop___024root___eval(Vtop___024root *vlSelf);

namespace {

#ifdef MXU_TRACE
// The chip's trace port (mxu.hdl.trace), as 32-bit words. A cycle in which any
// bit of `mask` is set is an event: its cycle (from the run's first running
// cycle) and the whole port are kept; activation rows entering the array are
// counted per `bucket` cycles.
struct TraceBuffer {
    static constexpr int WORDS = sizeof(((Vtop *)nullptr)->trace_events) / sizeof(uint32_t);
    // Events kept per run at most (36 bytes each): a longer run keeps its first
    // ones and says it was truncated.
    static constexpr uint64_t MAX_EVENTS = 4u << 20;
    bool on = false, in_run = false, truncated = false;
    uint32_t mask[WORDS] = {};
    uint32_t accept_bit = 0, running_bit = 0, bucket = 256;
    uint64_t run_start = 0;
    std::vector<uint32_t> events;        // per event: cycle (2 words), then WORDS words
    std::vector<uint32_t> buckets;
    void sample(const uint32_t *w, uint64_t cycle) {
        bool running = (w[running_bit / 32] >> (running_bit % 32)) & 1;
        if (!running) return;
        if (!in_run) { in_run = true; run_start = cycle; }
        uint64_t t = cycle - run_start;
        if ((w[accept_bit / 32] >> (accept_bit % 32)) & 1) {
            uint64_t b = t / bucket;
            if (buckets.size() <= b) buckets.resize(b + 1, 0);
            buckets[b]++;
        }
        bool any = false;
        for (int i = 0; i < WORDS; i++) any |= (w[i] & mask[i]) != 0;
        if (!any) return;
        if (events.size() >= MAX_EVENTS * (2 + WORDS)) { truncated = true; return; }
        events.push_back((uint32_t)t);
        events.push_back((uint32_t)(t >> 32));
        events.insert(events.end(), w, w + WORDS);
    }
};
#endif

// AXI4-Lite outputs of the chip as they were during the last cycle (sampled
// before its rising edge, so a handshake is valid && ready here).
struct HostSample {
    bool awready = false, wready = false, bvalid = false, arready = false, rvalid = false;
    uint32_t bresp = 0, rresp = 0, rdata = 0;
};

// AXI4-Lite inputs the harness drives; set before the evaluation with clk low.
struct Host {
    uint32_t awaddr = 0, wdata = 0, araddr = 0;
    bool awvalid = false, wvalid = false, bready = false, arvalid = false, rready = false;
};

struct Chip {
    VerilatedContext ctx;
    std::unique_ptr<Vtop> top;
    mxu::AxiMem mem;
    mxu::AxiPins pins;
    mxu::LinkModel links;
    HostSample host;
#ifdef MXU_ONE_EVAL
    // The inputs of the last evaluation (MXU_ONE_EVAL, step): while they stay
    // the same, the model's outputs are those it settled to after the edge.
    Host last_host;
    bool last_rst = false, settled = false;
#endif
    // The slave outputs of the memory model's last quiet cycle (AxiMem::quiet),
    // packed as mxu_axi_mem_step gives them, while valid for its epoch: the
    // quiet cycles after it give them again without stepping the model.
    uint32_t quiet_s[mxu::AXI_MAX_WORDS + 1] = {};
    uint64_t quiet_epoch = UINT64_MAX;
    bool quiet_skip = true;          // off: every cycle steps the model (the tests' reference)
    uint64_t cycles = 0;
    // Waveform window: cycles [trace_from, trace_until) are dumped.
    uint64_t trace_from = 0, trace_until = UINT64_MAX;
#ifdef MXU_TRACE
    TraceBuffer tbuf;
#endif
#if VM_TRACE
    std::unique_ptr<TraceFile> trace;
#endif
    Chip(uint64_t bytes, uint32_t data_bytes) : mem(bytes, data_bytes) {
#if VM_TRACE
        ctx.traceEverOn(true);
#endif
        top.reset(new Vtop(&ctx));
    }
    ~Chip() {
#if VM_TRACE
        if (trace) trace->close();
#endif
    }
    void dump(uint64_t t) {
#if VM_TRACE
        if (trace && cycles >= trace_from && cycles < trace_until) trace->dump(t);
#else
        (void)t;
#endif
    }
};


// The chip being evaluated in this thread: set before every eval(), and handed
// to the models inside the chip once, at its first evaluation (mxu_chip_bind).
thread_local Chip *current = nullptr;

// Verilator's evaluation of the model, without what Vtop::eval_step adds around
// it once the model is initialised: the deleter of class objects and the queue
// of messages that other threads post ($display), neither of which a chip model
// has (its Verilog has no classes and no system tasks). Their locks and calls
// were 3 % of a fast-MAC run (docs/simulation.md, "Where the time goes"). A
// waveform build keeps eval_step, which marks the activity its dumps follow.
void eval(Vtop &t) {
#if !VM_TRACE
    if (VL_LIKELY(t.rootp->vlSymsp->__Vm_didInit)) {
        Vtop___024root___eval(t.rootp);
        return;
    }
#endif
    t.eval();
}

void set_inputs(Vtop &t, const Host &h) {
    t.host___05Fawaddr = h.awaddr; t.host___05Fawvalid = h.awvalid;
    t.host___05Fwdata = h.wdata; t.host___05Fwstrb = 0xF; t.host___05Fwvalid = h.wvalid;
    t.host___05Fbready = h.bready;
    t.host___05Faraddr = h.araddr; t.host___05Farvalid = h.arvalid;
    t.host___05Frready = h.rready;
}

#ifdef MXU_ONE_EVAL
bool same_inputs(const Host &a, const Host &b) {
    return a.awaddr == b.awaddr && a.wdata == b.wdata && a.araddr == b.araddr &&
           a.awvalid == b.awvalid && a.wvalid == b.wvalid && a.bready == b.bready &&
           a.arvalid == b.arvalid && a.rready == b.rready;
}
#endif

// One cycle. The classic model is evaluated twice: clk low with this cycle's
// inputs (what the host port then presents is sampled, and the clock gates
// sample their enables at the falling edge), then the rising edge. A model
// built with one_eval (chip_verilog; MXU_ONE_EVAL) runs its clocked blocks at
// both edges of their clocks: one evaluation toggles clk, and the gated
// clocks in the cycles whose gate_<e>_awake was high before the edge -- the
// gate's enable as the falling edge sampled it. The evaluation with clk low
// is needed only when an input has changed since the last one: otherwise the
// model's outputs are those it settled to after the last edge
// (docs/simulation.md, "One evaluation a cycle").
void step(Chip &c, const Host &h) {
    Vtop &t = *c.top;
    current = &c;
#ifdef MXU_ONE_EVAL
    if (!c.settled || t.rst != c.last_rst || !same_inputs(h, c.last_host)) {
        set_inputs(t, h);
        eval(t);
        c.last_host = h;
        c.last_rst = t.rst;
        c.settled = true;
    }
#else
    set_inputs(t, h);
    t.clk = 0;
    eval(t);
#endif
    c.dump(10 * c.cycles + 5);
#ifdef MXU_TRACE
    if (c.tbuf.on) {
        uint32_t w[TraceBuffer::WORDS];
        mxu::to_words(t.trace_events, w);
        c.tbuf.sample(w, c.cycles);
    }
#endif
    c.host.awready = t.host___05Fawready; c.host.wready = t.host___05Fwready;
    c.host.bvalid = t.host___05Fbvalid; c.host.bresp = t.host___05Fbresp;
    c.host.arready = t.host___05Farready; c.host.rvalid = t.host___05Frvalid;
    c.host.rdata = t.host___05Frdata; c.host.rresp = t.host___05Frresp;
#ifdef MXU_ONE_EVAL
    if (t.gate_store_awake) t.gate_store_clk = !t.gate_store_clk;
#ifdef MXU_VECTOR_GATE
    if (t.gate_vector_awake) t.gate_vector_clk = !t.gate_vector_clk;
#endif
    t.clk = !t.clk;
#else
    t.clk = 1;
#endif
    eval(t);      // the rising edge: the memory model's mxu_axi_mem_step runs in it
    c.dump(10 * c.cycles + 10);
    c.cycles++;
}

// Bits [lo, lo + width) of a packed DPI vector, width <= 32.
uint32_t bits(const svBitVecVal *v, int lo, int width) {
    uint64_t pair = v[lo / 32];
    if ((lo % 32) + width > 32) pair |= (uint64_t)v[lo / 32 + 1] << 32;
    uint32_t mask = width == 32 ? 0xFFFFFFFFu : (1u << width) - 1u;
    return (uint32_t)(pair >> (lo % 32)) & mask;
}

// Bits [lo, lo + 64) of a packed DPI vector of `n_words` words (those past its
// end read as 0).
uint64_t window(const svBitVecVal *v, int lo, int n_words) {
    unsigned __int128 x = 0;
    for (int i = 0; i < 3 && lo / 32 + i < n_words; i++)
        x |= (unsigned __int128)v[lo / 32 + i] << (32 * i);
    return (uint64_t)(x >> (lo % 32));
}

void put_bits(svBitVecVal *v, int lo, int width, uint32_t value) {
    const uint64_t mask = (width == 32 ? 0xFFFFFFFFull : (1ull << width) - 1) << (lo % 32);
    const uint64_t shifted = ((uint64_t)value << (lo % 32)) & mask;
    v[lo / 32] = (v[lo / 32] & ~(uint32_t)mask) | (uint32_t)shifted;
    if (mask >> 32) v[lo / 32 + 1] = (v[lo / 32 + 1] & ~(uint32_t)(mask >> 32)) | (uint32_t)(shifted >> 32);
}

const uint64_t HOST_TIMEOUT = 64;

}  // namespace

extern "C" {

// The memory model inside the Verilated chip (mxu.sim.backends.axi_memory): at
// the rising edge that ends a cycle, that cycle's handshakes complete (update,
// with the master's outputs `m`) and the slave's outputs of the next cycle are
// computed (drive, into `s`). Field order: MASTER_FIELDS and SLAVE_FIELDS there.
void *mxu_chip_bind() { return current; }

void mxu_axi_mem_step(void *chip, int addr_bits, const svBitVecVal *m, svBitVecVal *s) {
    Chip &c = *static_cast<Chip *>(chip);
    mxu::AxiPins &p = c.pins;
    const int data_bits = 8 * c.mem.data_bytes(), words = data_bits / 32;
    // The packed slave outputs: rdata, then the 12 bits of SLAVE_FIELDS in a word.
    const int s_words = words + 1;
    // MASTER_FIELDS (34 bits) after wdata, wstrb, awaddr and araddr, at these
    // offsets in `f`: awlen 0, awsize 8, awburst 11, awid 13, awvalid 14,
    // wlast 15, wvalid 16, bready 17, arlen 18, arsize 26, arburst 29, arid 31,
    // arvalid 32, rready 33.
    const int fields = data_bits + data_bits / 8 + 2 * addr_bits;
    const uint64_t f = window(m, fields, (fields + 34 + 31) / 32);
    const bool offered = (f >> 14 & 1) | (f >> 16 & 1) | (f >> 32 & 1);
    const bool quiet = c.quiet_skip && !offered && c.mem.quiet();
    if (quiet && c.quiet_epoch == c.mem.epoch()) {
        c.mem.cycle++;
        std::memcpy(s, c.quiet_s, s_words * sizeof(uint32_t));
        return;
    }
    for (int i = 0; i < words; i++) p.wdata[i] = m[i];
    int at = data_bits;
    for (int i = 0; i < data_bits / 8; i += 32, at += 32)
        p.wstrb[i / 32] = bits(m, at, data_bits / 8 - i < 32 ? data_bits / 8 - i : 32);
    p.awaddr = bits(m, data_bits + data_bits / 8, addr_bits);
    p.araddr = bits(m, data_bits + data_bits / 8 + addr_bits, addr_bits);
    p.awlen = f & 0xFF; p.awsize = f >> 8 & 7; p.awburst = f >> 11 & 3; p.awid = f >> 13 & 1;
    p.awvalid = f >> 14 & 1; p.wlast = f >> 15 & 1; p.wvalid = f >> 16 & 1; p.bready = f >> 17 & 1;
    p.arlen = f >> 18 & 0xFF; p.arsize = f >> 26 & 7; p.arburst = f >> 29 & 3; p.arid = f >> 31 & 1;
    p.arvalid = f >> 32 & 1; p.rready = f >> 33 & 1;
    c.mem.update(p);
    c.mem.drive(p);
    for (int i = 0; i < words; i++) s[i] = p.rdata[i];
    s[words] = p.rresp | p.rlast << 2 | p.rvalid << 3 | p.rid << 4 | p.bresp << 5 | p.bvalid << 7 |
               p.bid << 8 | p.awready << 9 | p.wready << 10 | p.arready << 11;
    c.quiet_epoch = quiet ? c.mem.epoch() : UINT64_MAX;
    if (quiet) std::memcpy(c.quiet_s, s, s_words * sizeof(uint32_t));
}

// The links' model inside the Verilated chip (mxu.sim.backends.link_model): at
// the rising edge that ends cycle `cycles`, what the chip sent in it, and the
// link inputs of the next cycle. Bit order: CHIP_OUTPUTS and MODEL_OUTPUTS there.
void mxu_link_step(void *chip, int links, int flit_bits, const svBitVecVal *m, svBitVecVal *s) {
    Chip &c = *static_cast<Chip *>(chip);
    mxu::LinkModel &model = c.links;
    const int words = flit_bits / 32, flags = links * flit_bits;
    if (int(model.links.size()) != links) model.setup(links, flit_bits / 8, flit_bits / 8);
    for (int i = 0; i < links; i++)
        model.sent(i, c.cycles, bits(m, flags + i, 1), m + i * words, bits(m, flags + links + i, 1));
    for (int i = 0; i < links; i++) model.drive(i, c.cycles + 1, s + i * words);
    for (int i = 0; i < links; i++) {
        put_bits(s, flags + i, 1, model.valid_in[i]);
        put_bits(s, flags + links + i, 1, model.ready_out[i]);
        put_bits(s, flags + 2 * links + i, 1, model.credit_in[i]);
    }
}

// Hard reset: the chip's reset for a few cycles, and every transaction the
// memory model still holds for the old program dropped (its bytes, timing
// parameters and error ranges stay).
void mxu_chip_reset(void *h) {
    Chip &c = *static_cast<Chip *>(h);
    Host idle;
    // The slave outputs the model believes it presents go back to idle with
    // the abort (the model's registers follow at the next edge, in reset).
    c.mem.abort();
    c.pins = mxu::AxiPins();
    c.top->rst = 1;
    for (int i = 0; i < 4; i++) step(c, idle);
    c.top->rst = 0;
    step(c, idle);
    c.mem.abort();
    c.pins = mxu::AxiPins();
    c.links.clear();
}

void *mxu_chip_new(uint64_t mem_bytes, uint32_t data_bytes) {
#if defined(MXU_THREADS) && defined(__GLIBC__)
    // A model on several threads ran 2-3x slower when its state came from the
    // heap rather than from a mapping of its own, which is what glibc does
    // once a large block has been freed (another chip, a large array): it
    // raises its mapping threshold. Fixing the threshold keeps large blocks
    // mapped (docs/simulation.md, "Threads").
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
    Chip *c = new Chip(mem_bytes, data_bytes);
    mxu_chip_reset(c);
    return c;
}

void mxu_chip_free(void *h) { delete static_cast<Chip *>(h); }

// Start recording a waveform of the signals at most `levels` levels below the
// hierarchy `scope` ("TOP", "TOP.top.chip.core", ...; levels 0: everything) -- traced
// builds only; -1 otherwise, -2 if the file could not be opened.
int mxu_chip_trace(void *h, const char *path, int levels, const char *scope) {
#if VM_TRACE
    Chip &c = *static_cast<Chip *>(h);
    c.trace.reset(new TraceFile);
    c.top->trace(c.trace.get(), 99);
    if (levels > 0) c.trace->dumpvars(levels, scope);
    c.trace->open(path);
    if (!c.trace->isOpen()) { c.trace.reset(); return -2; }
    return 0;
#else
    (void)h; (void)path; (void)levels; (void)scope;
    return -1;
#endif
}

void mxu_chip_trace_window(void *h, uint64_t from, uint64_t until) {
    Chip &c = *static_cast<Chip *>(h);
    c.trace_from = from;
    c.trace_until = until;
}

void mxu_chip_trace_flush(void *h) {
#if VM_TRACE
    Chip &c = *static_cast<Chip *>(h);
    if (c.trace) c.trace->flush();
#else
    (void)h;
#endif
}

uint64_t mxu_chip_cycles(void *h) { return static_cast<Chip *>(h)->cycles; }

// The profiler's trace (builds with -DMXU_TRACE): start recording afresh, with
// the event mask, the bit positions of array_accept and running, and the bucket
// size; returns the trace port's width in words, or -1 without a trace port.
int mxu_chip_trace_begin(void *h, const uint32_t *mask, uint32_t accept_bit, uint32_t running_bit,
                         uint32_t bucket) {
#ifdef MXU_TRACE
    TraceBuffer &b = static_cast<Chip *>(h)->tbuf;
    b.on = true; b.in_run = false; b.truncated = false;
    for (int i = 0; i < TraceBuffer::WORDS; i++) b.mask[i] = mask[i];
    b.accept_bit = accept_bit; b.running_bit = running_bit; b.bucket = bucket ? bucket : 1;
    b.events.clear(); b.buckets.clear();
    return TraceBuffer::WORDS;
#else
    (void)h; (void)mask; (void)accept_bit; (void)running_bit; (void)bucket;
    return -1;
#endif
}

// The recorded events (count; *words points at 2 + width words per event) and
// buckets (count; *counts).
uint64_t mxu_chip_trace_events(void *h, const uint32_t **words) {
#ifdef MXU_TRACE
    TraceBuffer &b = static_cast<Chip *>(h)->tbuf;
    *words = b.events.data();
    return b.events.size() / (2 + TraceBuffer::WORDS);
#else
    (void)h; *words = nullptr;
    return 0;
#endif
}

int mxu_chip_trace_truncated(void *h) {
#ifdef MXU_TRACE
    return static_cast<Chip *>(h)->tbuf.truncated;
#else
    (void)h;
    return 0;
#endif
}

uint64_t mxu_chip_trace_buckets(void *h, const uint32_t **counts) {
#ifdef MXU_TRACE
    TraceBuffer &b = static_cast<Chip *>(h)->tbuf;
    *counts = b.buckets.data();
    return b.buckets.size();
#else
    (void)h; *counts = nullptr;
    return 0;
#endif
}
int mxu_chip_irq(void *h) { return static_cast<Chip *>(h)->top->irq; }

uint8_t *mxu_chip_mem(void *h) { return static_cast<Chip *>(h)->mem.mem.data(); }

void mxu_chip_mem_params(void *h, uint32_t lat_min, uint32_t lat_max, const uint32_t *pause5,
                         uint64_t seed) {
    mxu::AxiMemParams p;
    p.lat_min = lat_min;
    p.lat_max = lat_max;
    for (int i = 0; i < 5; i++) p.pause_pct[i] = pause5[i];
    p.seed = seed;
    static_cast<Chip *>(h)->mem.set_params(p);
}

void mxu_chip_add_error(void *h, uint64_t lo, uint64_t hi, uint32_t resp) {
    static_cast<Chip *>(h)->mem.add_error(lo, hi, resp);
}

void mxu_chip_clear_errors(void *h) { static_cast<Chip *>(h)->mem.clear_errors(); }

// Returns 0 and the response in *resp, or -1 if the slave never answered.
int mxu_chip_reg_write(void *h, uint32_t addr, uint32_t data, uint32_t *resp) {
    Chip &c = *static_cast<Chip *>(h);
    Host host;
    host.awaddr = addr; host.wdata = data; host.awvalid = host.wvalid = true;
    for (uint64_t n = 0;; n++) {
        if (n > HOST_TIMEOUT) return -1;
        step(c, host);
        if (c.host.awready && c.host.wready) break;
    }
    host.awvalid = host.wvalid = false;
    host.bready = true;
    for (uint64_t n = 0;; n++) {
        if (n > HOST_TIMEOUT) return -1;
        step(c, host);
        if (c.host.bvalid) break;
    }
    *resp = c.host.bresp;
    return 0;
}

int mxu_chip_reg_read(void *h, uint32_t addr, uint32_t *data, uint32_t *resp) {
    Chip &c = *static_cast<Chip *>(h);
    Host host;
    host.araddr = addr; host.arvalid = true;
    for (uint64_t n = 0;; n++) {
        if (n > HOST_TIMEOUT) return -1;
        step(c, host);
        if (c.host.arready) break;
    }
    host.arvalid = false;
    host.rready = true;
    for (uint64_t n = 0;; n++) {
        if (n > HOST_TIMEOUT) return -1;
        step(c, host);
        if (c.host.rvalid) break;
    }
    *data = c.host.rdata;
    *resp = c.host.rresp;
    return 0;
}

// Clock until irq rises or `budget` cycles have passed; returns the cycles run.
uint64_t mxu_chip_run_for(void *h, uint64_t budget) {
    Chip &c = *static_cast<Chip *>(h);
    Host idle;
    uint64_t start = c.cycles;
    while (!c.top->irq && c.cycles - start < budget) step(c, idle);
    return c.cycles - start;
}

// Protocol violations the memory model saw since the last clear (count), and
// the first one's text.
const char *mxu_chip_violations(void *h, uint64_t *count) {
    Chip &c = *static_cast<Chip *>(h);
    *count = c.mem.violations;
    return c.mem.first_violation.c_str();
}

void mxu_chip_clear_violations(void *h) {
    Chip &c = *static_cast<Chip *>(h);
    c.mem.violations = 0;
    c.mem.first_violation.clear();
}

uint64_t mxu_chip_mem_busy(void *h) { return static_cast<Chip *>(h)->mem.busy(); }

// Whether the memory model's quiet cycles skip its step (mxu_axi_mem_step).
void mxu_chip_skip_quiet_memory(void *h, int on) {
    Chip &c = *static_cast<Chip *>(h);
    c.quiet_skip = on != 0;
    c.quiet_epoch = UINT64_MAX;
}

// ---- links (docs/pod.md) ----------------------------------------------------
// Clock exactly `n` cycles, whatever irq does: a pod's lockstep window.
void mxu_chip_clock(void *h, uint64_t n) {
    Chip &c = *static_cast<Chip *>(h);
    Host idle;
    for (uint64_t i = 0; i < n; i++) step(c, idle);
}

void mxu_chip_link_setup(void *h, int links, uint32_t flit_bytes, uint32_t bytes_per_cycle) {
    static_cast<Chip *>(h)->links.setup(links, flit_bytes, bytes_per_cycle);
}

// Flits and credits link `i` has sent and the pod not yet taken.
void mxu_chip_link_pending(void *h, int i, uint64_t *flits, uint64_t *credits) {
    mxu::Link &l = static_cast<Chip *>(h)->links.links[i];
    *flits = l.sent.size();
    *credits = l.credits_sent.size();
}

// Takes them: cycles to `flit_cycles`, flit bytes to `data`, credits' cycles
// to `credit_cycles` (sized by mxu_chip_link_pending).
void mxu_chip_link_take(void *h, int i, uint64_t *flit_cycles, uint8_t *data,
                        uint64_t *credit_cycles) {
    mxu::LinkModel &model = static_cast<Chip *>(h)->links;
    mxu::Link &l = model.links[i];
    for (size_t k = 0; k < l.sent.size(); k++) {
        flit_cycles[k] = l.sent[k].cycle;
        std::memcpy(data + k * model.flit_bytes, l.sent[k].data.data(), model.flit_bytes);
    }
    for (size_t k = 0; k < l.credits_sent.size(); k++) credit_cycles[k] = l.credits_sent[k];
    l.sent.clear();
    l.credits_sent.clear();
}

// Flits and credits due on link `i` at the given cycles (ascending, after any
// given before).
void mxu_chip_link_give(void *h, int i, uint64_t n_flits, const uint64_t *flit_cycles,
                        const uint8_t *data, uint64_t n_credits, const uint64_t *credit_cycles) {
    mxu::LinkModel &model = static_cast<Chip *>(h)->links;
    mxu::Link &l = model.links[i];
    for (uint64_t k = 0; k < n_flits; k++) {
        mxu::Flit f{flit_cycles[k], std::vector<uint32_t>(model.flit_bytes / 4)};
        std::memcpy(f.data.data(), data + k * model.flit_bytes, model.flit_bytes);
        l.arriving.push_back(std::move(f));
    }
    for (uint64_t k = 0; k < n_credits; k++) l.credits_arriving.push_back(credit_cycles[k]);
}

// Flits and credits given but not yet presented to the chip.
uint64_t mxu_chip_link_arriving(void *h, int i) {
    mxu::Link &l = static_cast<Chip *>(h)->links.links[i];
    return l.arriving.size() + l.credits_arriving.size();
}

}
