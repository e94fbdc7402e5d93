"""Ring collectives as chip programs (docs/pod.md, "Collectives").

Each chip of a ring of ``n`` holds a message of ``rows`` accumulator rows
(fp32, ``config.cols`` each) at external address ``ext_in``. The message is cut
into ``n`` chunks (`chunks`); a chunk travels in blocks of at most
``block_rows`` rows, so that the load, vector and store engines work on
different blocks at once.

* **Reduce-scatter**, steps ``s = 0 .. n-2``: chip ``i`` sends chunk
  ``(i - s) mod n`` on its ``send`` link and receives chunk ``(i - s - 1) mod
  n`` on its ``recv`` link into a ring of ``slots`` receive buffers, and adds
  it to its own copy with a VECTOR ADD. Chunk ``c`` is therefore summed in ring
  order from chip ``c``: ``((x[c] + x[c+1]) + x[c+2]) + ... + x[c-1]`` (indices
  mod n), and ends on chip ``c - 1``. The golden pod form (docs/pod.md)
  performs the same fp32 additions.
* **All-gather**, steps ``s = 0 .. n-2``: chip ``i`` sends chunk ``(i + h - s)
  mod n`` (the one it holds, then the ones it received) and receives chunk
  ``(i + h - 1 - s) mod n`` into the output, where ``h`` is 1 after a
  reduce-scatter (chip ``i`` completed chunk ``i + 1``) and 0 in a plain
  all-gather (chip ``i`` contributes chunk ``i``).

Accumulator layout: the message at rows ``[0, rows)``, the received chunks of
the all-gather at ``[rows, 2 rows)``, the receive buffers after them. The
result leaves by STORE to ``ext_out`` (``rows`` rows, in message order).

Token discipline (docs/isa.md): the load engine's RECVs reach the vector
engine through compute SYNCs (load -> compute -> vector); a buffer returns to
the load engine the same way backwards; an ADD's result reaches its SEND over
the vector -> store link, an all-gather RECV's over compute -> store.
"""

from dataclasses import dataclass

from .program import Program

__all__ = ["COLLECTIVES", "chunks", "halves", "ring_collective_program", "acc_rows_needed",
           "block_rows_for"]

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def chunks(rows, n):
    """``[(lo, hi), ...]``: the `n` chunks of a message of `rows` rows, as even
    as possible, the longer first."""
    q, r = divmod(rows, n)
    out, lo = [], 0
    for c in range(n):
        hi = lo + q + (c < r)
        out.append((lo, hi))
        lo = hi
    return out


def acc_rows_needed(rows, slots, block_rows):
    return 2 * rows + slots * block_rows


def _blocks(lo, hi, size):
    return [(b, min(b + size, hi)) for b in range(lo, hi, size)]


def block_rows_for(config, rows, n, slots=4):
    """Rows per block: about half a chunk, at most 512 (measured on the pod
    preset, docs/pod.md: a ring all-reduce of 1 MiB on 4 chips reaches 61 %
    of the links' bandwidth with 64-row blocks, 92 % with 256, 96 % with
    512; each block costs its instructions' start), and small enough for
    the receive buffers to fit beside the message."""
    chunk = -(-rows // n)
    block = min(512, max(1, -(-chunk // 2)))
    room = (config.acc_rows - 2 * rows) // slots
    return max(1, min(block, room))


def halves(rows):
    """The rows a bidirectional ring sends each way: ``[(0, h), (h, rows)]``,
    the first half (``h = ceil(rows / 2)``) to chip i + 1, the second to
    chip i - 1."""
    h = -(-rows // 2)
    return [(0, h), (h, rows)]


def ring_collective_program(config, kind, *, n, index, rows, ext_in, ext_out, send_link=0,
                            recv_link=1, block_rows=None, slots=4, bidirectional=False):
    """The `Program` of chip `index` in a ring of `n` for the
    collective `kind` ("all_reduce", "reduce_scatter" or "all_gather").

    all_reduce and all_gather leave the whole message at ``ext_out``;
    reduce_scatter only its chunk ``(index + 1) mod n`` (the other rows of
    ``ext_out`` are not written). all_gather starts from chunk ``(index + 1)
    mod n`` of each chip's message (its other rows are not read).

    `bidirectional` (all_reduce only): the first half of the rows goes round
    the ring as above, the second half the other way (sent on `recv_link`,
    received on `send_link`), where chunk ``c`` is summed from chip ``c``
    down: ``((x[c] + x[c-1]) + x[c-2]) + ...``. Both at once: each link then
    carries half the bytes each way."""
    if kind not in COLLECTIVES:
        raise ValueError(f"kind must be one of {', '.join(map(repr, COLLECTIVES))}, not {kind!r}")
    if not 1 <= rows:
        raise ValueError(f"a collective moves at least one row, not {rows}")
    block_rows = block_rows or block_rows_for(config, rows, n, slots)
    need = acc_rows_needed(rows, slots, block_rows)
    if need > config.acc_rows:
        raise ValueError(f"a collective of {rows} rows needs {need} accumulator rows; the chip "
                         f"has {config.acc_rows}")
    if bidirectional and kind != "all_reduce":
        raise ValueError(f"a bidirectional ring runs all_reduce only, not {kind!r}")
    if bidirectional:
        (a0, a1), (b0, b1) = halves(rows)
        dirs = [_Direction([(a0 + lo, a0 + hi) for lo, hi in chunks(a1 - a0, n)], 1,
                           send_link, recv_link),
                _Direction([(b0 + lo, b0 + hi) for lo, hi in chunks(b1 - b0, n)], -1,
                           recv_link, send_link)]
    else:
        dirs = [_Direction(chunks(rows, n), 1, send_link, recv_link)]
    b = _Builder(config, n, index, rows, dirs, block_rows, slots)
    reduce = kind in ("all_reduce", "reduce_scatter")
    gather = kind in ("all_reduce", "all_gather")
    b.p.load(ext_addr=ext_in, rows=rows, row_bytes=b.rb, acc_row=0, push_next=1)
    b.p.sync("compute", pop_prev=1, push_next=1)
    if n > 1 and reduce:
        b.reduce_scatter()
    # The chunk a chip holds whole: after a reduce-scatter (i + 1) mod n; a
    # plain all-gather starts from chunk i.
    shift = 1 if reduce else 0
    if n > 1 and gather:
        b.all_gather(after_reduce=reduce, shift=shift)
    b.store_result(ext_out, reduce, gather, shift)
    b.p.halt()
    return b.p


@dataclass(frozen=True)
class _Direction:
    """One way round the ring: its chunks (row ranges of the message), +1
    (chunk c summed from chip c up, sent to chip i + 1) or -1, and the links
    it sends and receives on."""
    parts: list
    sign: int
    send: int
    recv: int


class _Builder:
    """The instructions of one chip's collective, engine by engine in program
    order (each engine runs its own in order; tokens tie them).

    Two directions run in lockstep, block j of step s of one, then of the
    other: the tokens an engine pushes then come in the order the engine
    that pops them takes them, in both directions alike (a token counter
    only counts)."""

    def __init__(self, config, n, index, rows, dirs, block_rows, slots):
        self.config, self.n, self.i, self.rows = config, n, index, rows
        self.dirs = dirs
        self.block, self.slots = block_rows, slots
        self.rb = config.acc_row_bytes
        self.p = Program()
        self.first_send = True          # pops the LOAD's token (relayed by compute)
        # compute -> store tokens the final STOREs take: a start does not clear
        # token counters, so a program must leave none behind.
        self.tokens_left = 0

    def _chunk_blocks(self, d, c):
        lo, hi = d.parts[c % self.n]
        return _blocks(lo, hi, self.block)

    def _first_send(self):
        """The first SEND waits for the LOAD (its token, relayed by compute)."""
        first, self.first_send = self.first_send, False
        return int(first)

    # Every step is emitted block by block: SEND of block j, then RECV (and
    # what uses it) of block j. All chips follow the same order, so the
    # in-order dispatch into bounded engine queues never waits on a
    # neighbour's instruction that its own dispatch has not reached.
    def reduce_scatter(self):
        n, i, rb = self.n, self.i, self.rb
        total = sum(len(self._chunk_blocks(d, i - d.sign * (s + 1)))
                    for d in self.dirs for s in range(n - 1))
        k = 0
        for s in range(n - 1):
            steps = [(d, self._chunk_blocks(d, i - d.sign * s),
                      self._chunk_blocks(d, i - d.sign * (s + 1))) for d in self.dirs]
            for j in range(max(max(len(a), len(b)) for _, a, b in steps)):
                for d, sends, recvs in steps:
                    if j < len(sends):
                        lo, hi = sends[j]
                        if s == 0:
                            self.p.send(link=d.send, rows=hi - lo, row_bytes=rb, acc_row=lo,
                                        pop_prev=self._first_send())
                        else:       # after the ADD of step s - 1 that made these rows
                            self.p.send(link=d.send, rows=hi - lo, row_bytes=rb, acc_row=lo,
                                        vector=True, pop_prev=1)
                    if j < len(recvs):
                        self._reduce_block(d, *recvs[j], k, total)
                        k += 1

    def _reduce_block(self, d, lo, hi, k, total):
        """RECV the k-th block into a receive buffer, ADD it to the chip's own
        rows, and give the buffer back."""
        slot = 2 * self.rows + (k % self.slots) * self.block
        frees = k + self.slots < total
        self.p.recv(link=d.recv, rows=hi - lo, row_bytes=self.rb, acc_row=slot,
                    pop_next=int(k >= self.slots), push_next=1)
        self.p.sync("compute", vector=True, pop_prev=1, push_next=1)
        self.p.vector("add", a_row=lo, b_row=slot, dst_row=lo, rows=hi - lo, pop_prev=1,
                      push_prev=int(frees), push_next=1)
        if frees:
            self.p.sync("compute", vector=True, pop_next=1, push_prev=1)

    def all_gather(self, after_reduce, shift):
        n, i, rows, rb = self.n, self.i, self.rows, self.rb
        for s in range(n - 1):
            steps = [(d, self._chunk_blocks(d, i + d.sign * (shift - s)),
                      self._chunk_blocks(d, i + d.sign * (shift - 1 - s))) for d in self.dirs]
            for j in range(max(max(len(a), len(b)) for _, a, b in steps)):
                for d, sends, recvs in steps:
                    if j < len(sends):
                        self._forward(d, *sends[j], s, after_reduce)
                    if j < len(recvs):
                        lo, hi = recvs[j]
                        self.p.recv(link=d.recv, rows=hi - lo, row_bytes=rb, acc_row=rows + lo,
                                    push_next=1)
                        self.p.sync("compute", pop_prev=1, push_next=1)
                        self.tokens_left += s == n - 2     # for the final STOREs

    def _forward(self, d, lo, hi, s, after_reduce):
        """All-gather step s's SEND of rows [lo, hi)."""
        rb = self.rb
        if s == 0 and after_reduce:         # the chunk its ADDs completed
            self.p.send(link=d.send, rows=hi - lo, row_bytes=rb, acc_row=lo, vector=True,
                        pop_prev=1)
        elif s == 0:
            self.p.send(link=d.send, rows=hi - lo, row_bytes=rb, acc_row=lo,
                        pop_prev=self._first_send())
        else:                               # the block received at step s - 1
            self.p.send(link=d.send, rows=hi - lo, row_bytes=rb, acc_row=self.rows + lo,
                        pop_prev=1)

    def store_result(self, ext_out, reduced, gathered, shift):
        """The result to ``ext_out``: this chip's completed chunk from the
        message rows, and with `gathered` the others from the output rows
        (after the last RECV's token)."""
        n, i, rows, rb = self.n, self.i, self.rows, self.rb
        self.tokens_left += self._first_send()     # a chip whose chunks were empty
        if n == 1:
            self.p.store(ext_addr=ext_out, rows=rows, row_bytes=rb, acc_row=0, pop_prev=1)
            return
        owns = [self._chunk_blocks(d, i + d.sign * shift) for d in self.dirs]
        last_adds = reduced and not gathered    # they hand their rows over themselves
        for j in range(max(map(len, owns))):
            for blocks in owns:
                if j < len(blocks):
                    lo, hi = blocks[j]
                    self.p.store(ext_addr=ext_out + lo * rb, rows=hi - lo, row_bytes=rb,
                                 acc_row=lo, vector=last_adds, pop_prev=int(last_adds))
        # Every token left is taken before the gathered rows are stored (the
        # last one by their first STORE): then every RECV has written.
        others = [(lo, hi) for d in self.dirs for c, (lo, hi) in enumerate(d.parts)
                  if c != (i + d.sign * shift) % n and hi > lo]
        for _ in range(self.tokens_left - bool(others and gathered)):
            self.p.sync("store", pop_prev=1)
        if not gathered:
            return
        for k, (lo, hi) in enumerate(others):
            self.p.store(ext_addr=ext_out + lo * rb, rows=hi - lo, row_bytes=rb,
                         acc_row=rows + lo, pop_prev=int(k == 0 and self.tokens_left > 0))
