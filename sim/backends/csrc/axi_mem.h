// mxu external-memory model: a cycle-level AXI4 slave with a flat byte array,
// for Verilated native harnesses (docs/simulation.md: the memory lives inside the
// simulated top, Python only loads and reads its bytes, never stepping the clock).
//
//  * Any data width (8..1024 bits), INCR/FIXED/WRAP bursts, WSTRB, any number of
//    outstanding bursts up to max_reads / max_writes; responses in order.
//  * Latency: each burst waits a random lat_min..lat_max cycles (from AR, or from
//    its last W beat) before its first R beat / its B response.
//  * Back-pressure: pause_pct[ch] is the % of cycles in which the slave drops
//    AWREADY / WREADY / ARREADY or withholds a new BVALID / RVALID (once
//    asserted, a VALID is held until its handshake, as AXI requires).
//  * Error injection: add_error(lo, hi, resp) makes every beat touching
//    [lo, hi) answer SLVERR (2) or DECERR (3); beats beyond the array answer
//    DECERR. Erroring write beats are not written.
//  * Strictness: counts protocol violations of the master (VALID dropped or
//    payload changed before READY, bursts crossing 4 KiB, AxSIZE wider than the
//    bus, WLAST in the wrong place, WSTRB set on the bytes below an unaligned
//    address) and keeps the first one's description.
//
// Use: fill an AxiPins from the top's master outputs, call drive() before the
// falling-edge eval (it sets the slave outputs), eval, sample the master outputs
// into the pins, call update(), then the rising-edge eval. The MXU_AXI_* macros
// copy pins to and from a Verilated top whose AXI port is `prefix` (e.g.
// axi___05F for an Amaranth port named `axi`).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "verilated.h"

namespace mxu {

enum AxiChannel { AXI_AW = 0, AXI_W = 1, AXI_B = 2, AXI_AR = 3, AXI_R = 4 };

constexpr int AXI_MAX_WORDS = 32;  // 1024 bits

struct AxiPins {
    // master -> slave
    uint32_t awid = 0, awlen = 0, awsize = 0, awburst = 1;
    uint64_t awaddr = 0;
    bool awvalid = false;
    uint32_t wdata[AXI_MAX_WORDS] = {};
    uint32_t wstrb[AXI_MAX_WORDS / 8] = {};
    bool wlast = false, wvalid = false;
    bool bready = false;
    uint32_t arid = 0, arlen = 0, arsize = 0, arburst = 1;
    uint64_t araddr = 0;
    bool arvalid = false;
    bool rready = false;
    // slave -> master
    bool awready = false, wready = false, arready = false;
    uint32_t bid = 0, bresp = 0;
    bool bvalid = false;
    uint32_t rid = 0, rresp = 0;
    uint32_t rdata[AXI_MAX_WORDS] = {};
    bool rlast = false, rvalid = false;
};

// Copying Verilated ports (CData/SData/IData/QData/VlWide) to and from words.
inline void to_words(uint8_t v, uint32_t *w) { w[0] = v; }
inline void to_words(uint16_t v, uint32_t *w) { w[0] = v; }
inline void to_words(uint32_t v, uint32_t *w) { w[0] = v; }
inline void to_words(uint64_t v, uint32_t *w) { w[0] = (uint32_t)v; w[1] = (uint32_t)(v >> 32); }
template <std::size_t N> inline void to_words(const VlWide<N> &v, uint32_t *w) {
    for (std::size_t i = 0; i < N; i++) w[i] = v[i];
}
inline void from_words(uint8_t &v, const uint32_t *w) { v = (uint8_t)w[0]; }
inline void from_words(uint16_t &v, const uint32_t *w) { v = (uint16_t)w[0]; }
inline void from_words(uint32_t &v, const uint32_t *w) { v = w[0]; }
inline void from_words(uint64_t &v, const uint32_t *w) { v = w[0] | ((uint64_t)w[1] << 32); }
template <std::size_t N> inline void from_words(VlWide<N> &v, const uint32_t *w) {
    for (std::size_t i = 0; i < N; i++) v[i] = w[i];
}

#define MXU_AXI_SAMPLE(top, P, pins) do {                                            \
    (pins).awid = (top).P##awid; (pins).awaddr = (top).P##awaddr;                     \
    (pins).awlen = (top).P##awlen; (pins).awsize = (top).P##awsize;                   \
    (pins).awburst = (top).P##awburst; (pins).awvalid = (top).P##awvalid;             \
    ::mxu::to_words((top).P##wdata, (pins).wdata);                                   \
    ::mxu::to_words((top).P##wstrb, (pins).wstrb);                                   \
    (pins).wlast = (top).P##wlast; (pins).wvalid = (top).P##wvalid;                   \
    (pins).bready = (top).P##bready;                                                  \
    (pins).arid = (top).P##arid; (pins).araddr = (top).P##araddr;                     \
    (pins).arlen = (top).P##arlen; (pins).arsize = (top).P##arsize;                   \
    (pins).arburst = (top).P##arburst; (pins).arvalid = (top).P##arvalid;             \
    (pins).rready = (top).P##rready;                                                  \
} while (0)

#define MXU_AXI_DRIVE(top, P, pins) do {                                             \
    (top).P##awready = (pins).awready; (top).P##wready = (pins).wready;               \
    (top).P##arready = (pins).arready;                                                \
    (top).P##bid = (pins).bid; (top).P##bresp = (pins).bresp;                         \
    (top).P##bvalid = (pins).bvalid;                                                  \
    (top).P##rid = (pins).rid; (top).P##rresp = (pins).rresp;                         \
    ::mxu::from_words((top).P##rdata, (pins).rdata);                                 \
    (top).P##rlast = (pins).rlast; (top).P##rvalid = (pins).rvalid;                   \
} while (0)

struct AxiMemParams {
    uint32_t lat_min = 0, lat_max = 0;
    uint32_t pause_pct[5] = {0, 0, 0, 0, 0};   // AW, W, B, AR, R
    uint32_t max_reads = 8, max_writes = 8;
    uint64_t seed = 1;
};

class AxiMem {
  public:
    std::vector<uint8_t> mem;
    AxiMemParams params;
    // statistics
    uint64_t cycle = 0, ar_bursts = 0, aw_bursts = 0, r_beats = 0, w_beats = 0;
    uint64_t max_reads_seen = 0, max_writes_seen = 0, violations = 0;
    uint64_t r_errors = 0, b_errors = 0;
    std::string first_violation;

    AxiMem(uint64_t size, uint32_t data_bytes) : mem(size, 0), bytes_(data_bytes) {
        words_ = (data_bytes + 3) / 4;
        lg_ = 0;
        while ((1u << lg_) < data_bytes) lg_++;
        set_params(params);
    }

    void set_params(const AxiMemParams &p) {
        epoch_++;
        params = p;
        rng_ = p.seed ? p.seed : 0x9E3779B97F4A7C15ull;
    }

    uint32_t data_bytes() const { return bytes_; }

    void add_error(uint64_t lo, uint64_t hi, uint32_t resp) { errors_.push_back({lo, hi, resp}); }
    void clear_errors() { errors_.clear(); }

    // True while any burst is accepted but not fully answered.
    bool busy() const { return !reads_.empty() || !writes_.empty() || !bq_.empty() || !wq_.empty(); }

    // True when a cycle in which the master offers no request (AWVALID, WVALID
    // and ARVALID low) changes nothing but `cycle`, and drives the same
    // outputs as the cycle before it did: nothing in flight or presented, no
    // request left waiting, and no random pauses (each would draw a number).
    bool quiet() const {
        for (uint32_t pct : params.pause_pct)
            if (pct) return false;
        return !busy() && !r_presenting_ && !b_presenting_ && !ar_wait_ && !aw_wait_ && !w_wait_;
    }

    // Counts the calls of abort() and set_params(), which change what a quiet
    // cycle drives.
    uint64_t epoch() const { return epoch_; }

    // Forget every transaction in flight (the master was reset): the bytes, the
    // parameters, the error ranges and the statistics stay.
    void abort() {
        epoch_++;
        reads_.clear(); writes_.clear(); wq_.clear(); bq_.clear();
        r_presenting_ = b_presenting_ = r_last_ = false;
        ar_wait_ = aw_wait_ = w_wait_ = false;
    }

    // Set the slave outputs for this cycle.
    void drive(AxiPins &p) {
        p.arready = reads_.size() < params.max_reads && !pause(AXI_AR);
        p.awready = writes_.size() < params.max_writes && !pause(AXI_AW);
        p.wready = wq_.size() < 4096 && !pause(AXI_W);
        if (!r_presenting_ && !reads_.empty() && reads_.front().ready_at <= cycle && !pause(AXI_R)) {
            Burst &rb = reads_.front();
            uint64_t a = beat_addr(rb, rb.beat);
            r_presenting_ = true;
            r_resp_ = error_for(a, a + bytes_);
            std::memset(r_data_, 0, words_ * sizeof(uint32_t));
            if (r_resp_ == 0) {
                uint8_t *bytes = reinterpret_cast<uint8_t *>(r_data_);
                std::memcpy(bytes, &mem[a / bytes_ * bytes_], bytes_);
            } else {
                for (uint32_t i = 0; i < words_; i++) r_data_[i] = 0xDEADBEEF;
            }
            r_last_ = rb.beat == rb.len;
            r_id_ = rb.id;
        }
        p.rvalid = r_presenting_;
        p.rresp = r_resp_;
        p.rlast = r_last_;
        p.rid = r_id_;
        std::memcpy(p.rdata, r_data_, words_ * sizeof(uint32_t));
        if (!b_presenting_ && !bq_.empty() && bq_.front().ready_at <= cycle && !pause(AXI_B))
            b_presenting_ = true;
        p.bvalid = b_presenting_;
        p.bresp = b_presenting_ ? bq_.front().resp : 0;
        p.bid = b_presenting_ ? bq_.front().id : 0;
    }

    // Sample the handshakes of this cycle (master outputs settled) and advance.
    void update(const AxiPins &p) {
        check_stable(p);
        if (p.arvalid && p.arready) {
            Burst b = make_burst(p.araddr, p.arlen, p.arsize, p.arburst, p.arid, "AR");
            b.ready_at = cycle + 1 + latency();
            reads_.push_back(b);
            ar_bursts++;
            if (reads_.size() > max_reads_seen) max_reads_seen = reads_.size();
        }
        if (p.rvalid && p.rready) {
            r_presenting_ = false;
            r_beats++;
            if (r_resp_) r_errors++;
            Burst &rb = reads_.front();
            if (rb.beat++ == rb.len) reads_.pop_front();
        }
        if (p.awvalid && p.awready) {
            writes_.push_back(make_burst(p.awaddr, p.awlen, p.awsize, p.awburst, p.awid, "AW"));
            aw_bursts++;
            if (writes_.size() > max_writes_seen) max_writes_seen = writes_.size();
        }
        if (p.wvalid && p.wready) {
            WBeat w;
            std::memcpy(w.data, p.wdata, sizeof w.data);
            std::memcpy(w.strb, p.wstrb, sizeof w.strb);
            w.last = p.wlast;
            wq_.push_back(w);
        }
        if (p.bvalid && p.bready) {
            b_presenting_ = false;
            if (bq_.front().resp) b_errors++;
            bq_.pop_front();
        }
        // Apply one buffered W beat per cycle to the oldest write burst.
        if (!writes_.empty() && !wq_.empty()) {
            Burst &wb = writes_.front();
            WBeat &w = wq_.front();
            uint64_t a = beat_addr(wb, wb.beat);
            uint64_t lane0 = a / bytes_ * bytes_;
            bool any = false;
            uint64_t lo = ~0ull, hi = 0;
            for (uint32_t i = 0; i < bytes_; i++) {
                if (!(w.strb[i / 32] >> (i % 32) & 1)) continue;
                if (lane0 + i < a) violate("WSTRB set below the address of an unaligned beat");
                any = true;
                if (lane0 + i < lo) lo = lane0 + i;
                if (lane0 + i + 1 > hi) hi = lane0 + i + 1;
            }
            uint32_t resp = any ? error_for(lo, hi) : 0;
            if (resp) {
                if (resp > wb.resp) wb.resp = resp;
            } else if (any) {
                const uint8_t *bytes = reinterpret_cast<const uint8_t *>(w.data);
                for (uint32_t i = 0; i < bytes_; i++)
                    if (w.strb[i / 32] >> (i % 32) & 1) mem[lane0 + i] = bytes[i];
            }
            w_beats++;
            if (w.last != (wb.beat == wb.len)) violate("WLAST does not match AWLEN");
            wq_.pop_front();
            if (wb.beat++ == wb.len) {
                bq_.push_back({wb.id, wb.resp, cycle + 1 + latency()});
                writes_.pop_front();
            }
        }
        cycle++;
    }

  private:
    struct Burst {
        uint64_t addr;
        uint32_t len, size, burst, id, beat, resp;
        uint64_t ready_at;
    };
    struct WBeat {
        uint32_t data[AXI_MAX_WORDS];
        uint32_t strb[AXI_MAX_WORDS / 8];
        bool last;
    };
    struct BResp {
        uint32_t id, resp;
        uint64_t ready_at;
    };
    struct Region {
        uint64_t lo, hi;
        uint32_t resp;
    };

    uint32_t bytes_, words_, lg_;
    uint64_t rng_, epoch_ = 0;
    std::deque<Burst> reads_, writes_;
    std::deque<WBeat> wq_;
    std::deque<BResp> bq_;
    std::vector<Region> errors_;
    bool r_presenting_ = false, b_presenting_ = false, r_last_ = false;
    uint32_t r_resp_ = 0, r_id_ = 0;
    uint32_t r_data_[AXI_MAX_WORDS] = {};
    // stability checking: the previous cycle's unaccepted request on AR, AW, W
    bool ar_wait_ = false, aw_wait_ = false, w_wait_ = false;
    uint64_t ar_prev_[3] = {}, aw_prev_[3] = {};
    uint32_t w_prev_[AXI_MAX_WORDS + AXI_MAX_WORDS / 8 + 1] = {};

    uint64_t next_random() {
        rng_ ^= rng_ << 13; rng_ ^= rng_ >> 7; rng_ ^= rng_ << 17;
        return rng_;
    }
    bool pause(int ch) {
        uint32_t pct = params.pause_pct[ch];
        return pct && (next_random() % 100) < pct;
    }
    uint64_t latency() {
        uint32_t span = params.lat_max > params.lat_min ? params.lat_max - params.lat_min : 0;
        return params.lat_min + (span ? next_random() % (span + 1) : 0);
    }
    void violate(const std::string &what) {
        if (!violations++) {
            char buf[64];
            std::snprintf(buf, sizeof buf, "cycle %llu: ", (unsigned long long)cycle);
            first_violation = buf + what;
        }
    }
    uint32_t error_for(uint64_t lo, uint64_t hi) const {
        if (hi > mem.size()) return 3;
        uint32_t resp = 0;
        for (const Region &r : errors_)
            if (lo < r.hi && r.lo < hi && r.resp > resp) resp = r.resp;
        return resp;
    }
    Burst make_burst(uint64_t addr, uint32_t len, uint32_t size, uint32_t burst, uint32_t id,
                     const char *ch) {
        if (size > lg_) violate(std::string(ch) + "SIZE wider than the data bus");
        if (burst > 2) violate(std::string(ch) + "BURST reserved value");
        uint64_t n = 1ull << size;
        uint64_t start = addr / n * n;
        if (burst == 1 && (start & ~0xFFFull) != ((start + (len + 1) * n - 1) & ~0xFFFull))
            violate(std::string(ch) + " burst crosses a 4 KiB boundary");
        if (burst == 2 && (addr % n || (len != 1 && len != 3 && len != 7 && len != 15)))
            violate(std::string(ch) + " illegal WRAP burst");
        return Burst{addr, len, size, burst, id, 0, 0, 0};
    }
    // Address of beat `i` of a burst (AXI A3.4.1).
    uint64_t beat_addr(const Burst &b, uint32_t i) const {
        uint64_t n = 1ull << b.size;
        if (b.burst == 0) return b.addr;
        uint64_t aligned = b.addr / n * n;
        if (b.burst == 1) return i == 0 ? b.addr : aligned + (uint64_t)i * n;
        uint64_t total = n * (b.len + 1), lower = b.addr / total * total;
        return lower + (b.addr - lower + (uint64_t)i * n) % total;
    }
    // The previous cycle's request is compared, and this cycle's saved, only
    // while a VALID waits for its READY: most cycles copy nothing.
    void check_stable(const AxiPins &p) {
        uint64_t ar[3] = {p.araddr, p.arlen | (uint64_t)p.arsize << 8 | (uint64_t)p.arburst << 12, p.arid};
        uint64_t aw[3] = {p.awaddr, p.awlen | (uint64_t)p.awsize << 8 | (uint64_t)p.awburst << 12, p.awid};
        if (ar_wait_ && (!p.arvalid || std::memcmp(ar, ar_prev_, sizeof ar)))
            violate("ARVALID dropped or AR payload changed before ARREADY");
        if (aw_wait_ && (!p.awvalid || std::memcmp(aw, aw_prev_, sizeof aw)))
            violate("AWVALID dropped or AW payload changed before AWREADY");
        if (w_wait_ && (!p.wvalid || !same_w(p)))
            violate("WVALID dropped or W payload changed before WREADY");
        ar_wait_ = p.arvalid && !p.arready;
        aw_wait_ = p.awvalid && !p.awready;
        w_wait_ = p.wvalid && !p.wready;
        if (ar_wait_) std::memcpy(ar_prev_, ar, sizeof ar);
        if (aw_wait_) std::memcpy(aw_prev_, aw, sizeof aw);
        if (w_wait_) {
            std::memcpy(w_prev_, p.wdata, words_ * sizeof(uint32_t));
            std::memcpy(w_prev_ + AXI_MAX_WORDS, p.wstrb, sizeof p.wstrb);
            w_prev_[AXI_MAX_WORDS + AXI_MAX_WORDS / 8] = p.wlast;
        }
    }
    bool same_w(const AxiPins &p) const {
        return !std::memcmp(w_prev_, p.wdata, words_ * sizeof(uint32_t)) &&
               !std::memcmp(w_prev_ + AXI_MAX_WORDS, p.wstrb, sizeof p.wstrb) &&
               w_prev_[AXI_MAX_WORDS + AXI_MAX_WORDS / 8] == (uint32_t)p.wlast;
    }
};

}  // namespace mxu
