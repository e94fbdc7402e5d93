// The inter-chip links' model of one chip (docs/pod.md,
// mxu.sim.backends.link_model): per link, the flits and credits the chip has
// sent, stamped with their cycles, until the pod takes them, and those due to
// arrive, with their cycles, until the chip takes them. The link's bandwidth
// paces tx_ready; its latency is the pod's business (it stamps arrivals).
#pragma once
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

namespace mxu {

struct Flit {
    uint64_t cycle;
    std::vector<uint32_t> data;
};

struct Link {
    std::vector<Flit> sent;                 // taken by the pod
    std::vector<uint64_t> credits_sent;
    std::deque<Flit> arriving;              // given by the pod, in due order
    std::deque<uint64_t> credits_arriving;
    uint32_t budget = 0;                    // bytes the link may still carry now
};

struct LinkModel {
    std::vector<Link> links;
    uint32_t flit_bytes = 0, bytes_per_cycle = 0;
    bool ready_out[8] = {}, valid_in[8] = {}, credit_in[8] = {};

    void setup(int n, uint32_t flit, uint32_t bpc) {
        links.assign(n, Link());
        flit_bytes = flit;
        bytes_per_cycle = bpc;
        for (auto &l : links) l.budget = flit;
        std::memset(ready_out, 0, sizeof ready_out);
        std::memset(valid_in, 0, sizeof valid_in);
        std::memset(credit_in, 0, sizeof credit_in);
    }
    // Drops everything in flight (a hard reset of the chip).
    void clear() { setup(int(links.size()), flit_bytes, bytes_per_cycle); }

    // Cycle `now` ends: what the chip did in it (valid and ready: a flit
    // left; a credit given back).
    void sent(int i, uint64_t now, bool tx_valid, const uint32_t *payload, bool rx_credit) {
        Link &l = links[i];
        if (tx_valid && ready_out[i]) {
            l.sent.push_back(Flit{now, std::vector<uint32_t>(payload, payload + flit_bytes / 4)});
            l.budget -= flit_bytes;
        }
        if (rx_credit) l.credits_sent.push_back(now);
        uint64_t full = flit_bytes > bytes_per_cycle ? flit_bytes : bytes_per_cycle;
        l.budget = uint32_t(l.budget + bytes_per_cycle > full ? full : l.budget + bytes_per_cycle);
    }
    // The inputs of cycle `next`; the flit goes to `flit` when valid.
    void drive(int i, uint64_t next, uint32_t *flit) {
        Link &l = links[i];
        ready_out[i] = l.budget >= flit_bytes;
        valid_in[i] = !l.arriving.empty() && l.arriving.front().cycle <= next;
        if (valid_in[i]) {
            std::memcpy(flit, l.arriving.front().data.data(), flit_bytes);
            l.arriving.pop_front();
        }
        credit_in[i] = !l.credits_arriving.empty() && l.credits_arriving.front() <= next;
        if (credit_in[i]) l.credits_arriving.pop_front();
    }
};

}  // namespace mxu
