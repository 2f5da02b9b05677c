#!/usr/bin/env python3
"""Writes the seed inputs of kvtier_kv_cache_fuzz into tests/fuzz/corpus/.

Each seed is 4 configuration bytes and then operations, encoded as kv_cache_fuzz.cc decodes them
(one byte picks the operation, modulo the operation count; the bytes after it are its arguments).
They only give the fuzzer a start on realistic call sequences: any byte string is a valid input.
Run from anywhere: python3 tests/fuzz/make_corpus.py

The corpus also keeps inputs the fuzzer once failed on (regress_*: a warm restart over an NVMe
file with blocks, a failed transfer whose freed slot was reused before the cache forgot it, and
demotions counted before their evictions); this script leaves them alone. They are replayed
first in every fuzzing run, as regression tests. Note they encode operations by number, modulo
the operation count, so adding an operation anywhere in `enum class Op` changes what an op byte
at or above the old count means: re-encode them (each op byte b as b % old count), as was done
when the hint operations came (23 -> 28).
"""
import os

# Op numbers: the order of `enum class Op` in kv_cache_fuzz.cc.
(CREATE, ATTACH, APPEND, REPORT, FORK, ENSURE, RELEASE_TICKET, WAIT_TICKET, PAUSE, RESUME,
 RELEASE, PREFETCH, LOOKUP, GET, STATS, POLL, CLOCK, COMPLETE_READY, WAIT_IDLE, FAULT,
 REMOTE, RESTART, FOREIGN, RELEASE_HINTED, RETAIN_PREFIX, INVALIDATE_PREFIX, RETAIN_SESSION,
 INVALIDATE_SESSION) = range(28)

# Configuration bytes a, b, d, e (see DecodeConfig).
LAYER_FIRST_DRAM_NVME = [0x00, 0x06, 0x00, 0x00]       # HBM 12, write-back, lru
BLOCK_FIRST_WRITE_THROUGH = [0x11, 0x04, 0x00, 0x00]   # HBM 10
REMOTE_COST_AWARE_SMALL = [0x28, 0x08, 0x0C, 0x00]     # HBM 6, DRAM admits on 2nd use,
                                                       # 4 events kept, room_wait 1 ms
LEARNED_DRAM_NVME = [0x20, 0x06, 0x81, 0x10]           # HBM 12, learned, cheap recompute
REUSE_INDEX_REMOTE_SMALL = [0x28, 0x00, 0x82, 0x00]    # HBM 6, reuse_index, dear recompute

SEEDS = {
    # Two turns of a conversation: the second attaches the first's cached prefix.
    "serving_loop": LAYER_FIRST_DRAM_NVME + [
        CREATE, 1, 0x00,
        ATTACH, 1, 0, 20, 0,            # stem 0, 20 tokens: nothing cached yet
        APPEND, 1, 0, 12, 0,            # stem 0 from position 0
        APPEND, 1, 0, 8, 0,
        REPORT, 1, 0, 0,                # all tokens, ready now
        ENSURE, 1, 0, 0, 0,             # [0, n), kWait, no deadline
        RELEASE_TICKET, 0,
        RELEASE, 1,
        CREATE, 2, 0x00,
        ATTACH, 2, 3, 0, 0, 1, 1, 2,    # sequence 1's tokens plus 2 more
        APPEND, 2, 2, 2, 1, 2,
        ENSURE, 2, 0, 0, 0,
        REPORT, 2, 0, 0,
        STATS,
        POLL, 0, 1,
        LOOKUP, 1, 0, 0, 16, 0,
        WAIT_IDLE, 1,
    ],
    # Pending ready, pause and resume, best-effort and async tickets, fork with a partial block,
    # double releases, a restart over the NVMe file, a foreign ticket, bad ranges and deadlines.
    "pause_fork_restart": BLOCK_FIRST_WRITE_THROUGH + [
        CREATE, 3, 0x00,
        APPEND, 3, 0, 10, 1,
        REPORT, 3, 0, 6,                # ready pending
        COMPLETE_READY,
        PAUSE, 3, 1, 60,
        ENSURE, 3, 0, 1, 0,             # kBestEffort
        RESUME, 3,
        ENSURE, 3, 0, 2, 0,             # kAsync
        WAIT_TICKET, 1,
        FORK, 3, 4, 3, 6,               # child of 6 tokens: copies a 2-token block
        APPEND, 4, 3, 0, 1,
        REPORT, 4, 0, 0,
        ENSURE, 4, 0, 0, 0,
        RELEASE, 3,
        RELEASE, 3,
        RELEASE_TICKET, 0,
        RELEASE_TICKET, 0,
        CLOCK, 4,
        RESTART,
        CREATE, 5, 0x00,
        ATTACH, 5, 1, 12, 1, 0,         # a prefix of a sequence from before the restart
        FOREIGN,
        ENSURE, 5, 3, 1, 1, 1, 0, 0,    # begin > end
        ENSURE, 5, 0, 0, 1,             # deadline in the past
    ],
    # HBM pressure with a remote tier, injected read faults, the store going down, a pause
    # under pressure, invalid options and a prefetch.
    "pressure_faults": REMOTE_COST_AWARE_SMALL + [
        CREATE, 1, 0x02,                # tenant salt
        APPEND, 1, 0, 12, 2,
        REPORT, 1, 0, 0,
        APPEND, 1, 0, 12, 2,
        REPORT, 1, 0, 0,
        RELEASE, 1,
        FAULT, 1, 1, 1, 0,              # next 2 DRAM reads fail kUnavailable
        CREATE, 2, 0x02,
        ATTACH, 2, 3, 0, 0, 0, 3,
        APPEND, 2, 0, 12, 0,
        APPEND, 2, 0, 12, 0,
        ENSURE, 2, 0, 0, 0,
        REMOTE, 1,
        PAUSE, 2, 1, 10,
        STATS,
        POLL, 0, 1,
        CREATE, 7, 0x83,                # over-long salt: kInvalidArgument
        PREFETCH, 0, 0, 1, 24, 0, 0,
        WAIT_IDLE, 0,
    ],
    # An agent session: a tool call's release with an idle estimate, a retained session, the
    # sub-agent's last turn, a retained and an invalidated prefix, a session invalidated twice
    # (the second is rejected), a pause with no end in sight.
    "agent_hints": LEARNED_DRAM_NVME + [
        CREATE, 1, 0x00,                # session 1
        APPEND, 1, 0, 12, 0,            # stem 0, 12 tokens
        APPEND, 1, 0, 12, 0,            # 12 more
        REPORT, 1, 0, 0,
        RELEASE_HINTED, 1, 0x05, 9,     # tool_use, back in about 9 s
        RETAIN_SESSION, 1, 2, 1,        # priority 3 for 5 min
        CREATE, 2, 0x00,                # session 3
        ATTACH, 2, 3, 0, 0, 1, 1, 2,    # sequence 1's tokens plus 2 more
        APPEND, 2, 2, 2, 1, 2,
        REPORT, 2, 0, 0,
        RELEASE_HINTED, 2, 0x12,        # end_turn, last turn
        RETAIN_PREFIX, 0, 0x00, 1, 16, 0, 0, 1, 1,   # sequence 1's 16 tokens: 0.5 for 5 min
        INVALIDATE_PREFIX, 0, 0x00, 1, 16, 0, 0, 1,  # from the second block on
        CLOCK, 3,
        INVALIDATE_SESSION, 3,
        INVALIDATE_SESSION, 3,          # forgotten by the first: kRejected
        RETAIN_SESSION, 0, 0, 0,        # session 0: kRejected
        CREATE, 3, 0x00,
        APPEND, 3, 0, 12, 1,
        REPORT, 3, 0, 0,
        PAUSE, 3, 7,                    # no end in sight
        RELEASE_HINTED, 3, 0x0D,        # tool_use, an infinite estimate: kRejected
        LOOKUP, 1, 0, 0, 16, 0,
        STATS,
        WAIT_IDLE, 1,
    ],
    # A released conversation's last block invalidated (kAccepted): a lookup must stop before
    # it; then the whole prefix from block 0 and a lookup of it.
    "invalidate_tail": LEARNED_DRAM_NVME + [
        CREATE, 1, 0x00,
        APPEND, 1, 0, 12, 0,
        APPEND, 1, 0, 12, 0,
        REPORT, 1, 0, 0,
        RELEASE, 1,
        INVALIDATE_PREFIX, 0, 0x00, 1, 24, 0, 0, 4,  # the last full block alone
        INVALIDATE_PREFIX, 0, 0x00, 1, 24, 0, 0, 0,  # from block 0
        LOOKUP, 1, 0, 0, 24, 0,
        WAIT_IDLE, 1,
    ],
    # Hints under pressure with a remote tier: releases with bad and good hints, invalidations
    # of a prefix other sequences still hold.
    "hints_pressure": REUSE_INDEX_REMOTE_SMALL + [
        CREATE, 1, 0x00,
        APPEND, 1, 0, 12, 2,
        REPORT, 1, 0, 0,
        CREATE, 2, 0x00,
        ATTACH, 2, 3, 0, 0, 0, 3,       # sequence 1's tokens plus one
        APPEND, 2, 0, 12, 2,
        REPORT, 2, 0, 0,
        INVALIDATE_PREFIX, 0, 0x00, 3, 0, 0, 0, 1, 0,  # sequence 1's tokens, all blocks: held
        RELEASE_HINTED, 1, 0x21,        # tool_use, preempted
        RELEASE_HINTED, 2, 0x3A,        # end_turn, negative estimate, last turn, preempted
        RETAIN_SESSION, 3, 5, 4,        # sequence 2's session, infinite priority: kRejected
        RETAIN_SESSION, 3, 1, 4,        # 0.5 for ever
        INVALIDATE_PREFIX, 0, 0x00, 3, 0, 0, 0, 1, 0,
        CLOCK, 5,
        STATS,
        WAIT_IDLE, 1,
    ],
}


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes(data))
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
