"""The kvtier Python package against kv_cache.h's contract: geometry and namespaces, errors as
exceptions with their status codes, the serving loop (attach, append, tickets, report_written,
release), fork, hints, pause/resume, lookups, stats and events, and the scheduler calls (truncate,
RoomWait.NEVER, check_room, reset_prefix_cache, caching off, preemption and readmission). HBM pool
bytes are in test_hbm_pool.py."""
import gc
import time

import numpy as np
import pytest

import kvtier

B = 16  # tokens per block


def make_namespace(layout=kvtier.HbmLayout.LAYER_FIRST, weights="w1"):
    g = kvtier.KvGeometry(num_layers=2, num_kv_heads=2, head_dim=8, dtype=kvtier.KvDtype.FP16,
                          tokens_per_block=B)
    # An unknown model id: no prefill cost model, so attach restores every matched block.
    return kvtier.CacheNamespace(g, model_id="test-model", weights_fingerprint=weights,
                                 hbm_layout=layout)


def make_cache(hbm=8, dram=16, **options):
    ns = make_namespace()
    return kvtier.KvCache.create(ns, kvtier.TierStack(ns, hbm_blocks=hbm, dram_blocks=dram),
                                 **options)


def tokens(n, seed=0):
    return np.random.default_rng(seed).integers(0, 50000, n, dtype=np.int32)


def serve(cache, seq, prompt, **create):
    """One request: attach, append the rest, one forward pass, release. The attach result."""
    cache.create_sequence(seq, **create)
    hit = cache.attach_prefix(seq, prompt)
    cache.append(seq, prompt[hit.attached_tokens:])
    with cache.ensure_resident(seq, 0, len(prompt)):
        cache.report_written(seq, len(prompt))
    cache.release(seq)
    return hit


def test_geometry_sizes():
    g = make_namespace().geometry
    assert g.kv_planes == 2
    assert g.bytes_per_token_per_layer == 2 * 2 * 8 * 2
    assert g.bytes_per_block == B * 2 * (2 * 2 * 8 * 2)
    assert g.blocks_for_tokens(33) == 3
    assert g.dtype_name == "fp16"
    by_name = kvtier.KvGeometry(num_layers=2, num_kv_heads=2, head_dim=8, dtype="fp16",
                                tokens_per_block=B)
    assert by_name == g
    assert "layers=2" in repr(g)


def test_invalid_geometry_raises_invalid_argument():
    with pytest.raises(kvtier.InvalidArgumentError) as e:
        kvtier.KvGeometry(num_layers=0, num_kv_heads=2, head_dim=8)
    assert isinstance(e.value, kvtier.Error)
    assert e.value.code == 3
    assert e.value.code_name == "INVALID_ARGUMENT"
    assert "num_layers" in e.value.message
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.KvGeometry(num_layers=2, num_kv_heads=2, head_dim=8, dtype="int4")


def test_namespace_digest_follows_its_fields():
    a, b, c = make_namespace(), make_namespace(), make_namespace(weights="w2")
    assert a.digest == b.digest and len(a.digest) == 16
    assert a.digest_hex == a.digest.hex()
    assert a.digest != c.digest
    assert make_namespace(kvtier.HbmLayout.BLOCK_FIRST).digest != a.digest
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.CacheNamespace(a.geometry, model_id="", weights_fingerprint="w")


def test_errors_carry_the_documented_codes():
    cache = make_cache()
    with pytest.raises(kvtier.NotFoundError) as e:
        cache.append(99, [1, 2, 3])
    assert e.value.code == 5 and e.value.code_name == "NOT_FOUND"
    assert str(e.value).startswith("NOT_FOUND: ")
    cache.create_sequence(1)
    with pytest.raises(kvtier.AlreadyExistsError):
        cache.create_sequence(1)
    cache.append(1, tokens(20))
    with pytest.raises(kvtier.OutOfRangeError):
        cache.ensure_resident(1, 0, 21)
    with pytest.raises(kvtier.InvalidArgumentError):
        cache.ensure_resident(1, 10, 5)
    with pytest.raises(kvtier.DeadlineExceededError):
        cache.ensure_resident(1, 0, 20, timeout_s=-1.0)
    cache.report_written(1, 10)
    with pytest.raises(kvtier.InvalidArgumentError):
        cache.report_written(1, 5)  # below what was reported
    cache.release(1)
    with pytest.raises(kvtier.FailedPreconditionError):
        cache.release(1)
    with pytest.raises(kvtier.InvalidArgumentError):
        cache.append(1, np.zeros((2, 2), dtype=np.int32))  # not 1-D
    assert kvtier.error_class(5) is kvtier.NotFoundError
    assert issubclass(kvtier.ResourceExhaustedError, kvtier.Error)
    cache.check_invariants()


def test_attach_finds_the_written_prefix():
    cache = make_cache()
    first = tokens(40)
    assert serve(cache, 1, first).matched_tokens == 0
    second = np.concatenate([first, tokens(10, seed=1)])
    lookup = cache.lookup(second)
    assert lookup.matched_tokens == 32
    assert lookup.blocks_by_tier[int(kvtier.Tier.HBM)] == 2
    hit = serve(cache, 2, second)
    assert hit.matched_tokens == 32
    assert hit.attached_tokens == 32
    assert hit.attached_blocks_by_tier == [2, 0, 0, 0]
    assert hit.plan.restore_blocks == 2
    stats = cache.stats()
    assert stats.attach_queries == 2
    assert stats.query_tokens == 40 + 50
    assert stats.matched_tokens == 32
    assert stats.attached_tokens == 32
    assert stats.tier(kvtier.Tier.HBM).hits == 2
    assert stats.live_sequences == 0 and stats.open_tickets == 0
    # Sequence 2 wrote 50 tokens: 3 full blocks, the first 2 shared with sequence 1.
    assert stats.indexed_blocks == 3
    # Other identity extras name other blocks.
    assert cache.lookup(second, tenant_salt="tenant-b").matched_tokens == 0
    assert cache.lookup(second, adapter=kvtier.AdapterIdentity("lora", 1)).matched_tokens == 0


def test_token_ids_are_never_cast_lossily():
    # Found by review: tokens were cast to int32 unsafely, so 2**32 + t matched t's blocks and
    # 1.7 matched 1: two different prompts shared KV.
    cache = make_cache()
    prompt = tokens(40)
    serve(cache, 1, prompt)
    assert cache.lookup(prompt.astype(np.int64)).matched_tokens == 32
    assert cache.lookup(list(int(t) for t in prompt)).matched_tokens == 32
    wrapped = prompt.astype(np.int64)
    wrapped[0] += 2**32
    with pytest.raises(kvtier.InvalidArgumentError, match="fit int32"):
        cache.lookup(wrapped)
    with pytest.raises(kvtier.InvalidArgumentError, match="fit int32"):
        cache.lookup([int(t) for t in wrapped])
    with pytest.raises(kvtier.InvalidArgumentError, match="fit int32"):
        cache.lookup(np.array([3_000_000_000], dtype=np.uint32))
    with pytest.raises(kvtier.InvalidArgumentError, match="integer token ids"):
        cache.lookup(prompt.astype(np.float64) + 0.5)
    with pytest.raises(kvtier.InvalidArgumentError, match="integer token ids"):
        cache.lookup(["a", "b"])
    with pytest.raises(kvtier.InvalidArgumentError, match="one-dimensional"):
        cache.lookup(prompt.reshape(4, 10))
    assert cache.lookup([]).matched_tokens == 0
    cache.create_sequence(2)
    with pytest.raises(kvtier.InvalidArgumentError):
        cache.append(2, wrapped)
    assert cache.get_sequence(2).num_tokens == 0


def test_events_name_the_blocks_adapter():
    cache = make_cache()
    serve(cache, 1, tokens(40), adapter=kvtier.AdapterIdentity("lora-sql", 3))
    stored = [e for e in cache.poll_events() if e.kind == kvtier.CacheEventKind.STORED]
    assert len(stored) == 2
    assert [e.adapter_id for e in stored] == ["lora-sql", "lora-sql"]
    assert [e.worker_id for e in stored] == ["", ""]


def test_release_ticket_refuses_another_caches_ticket():
    # Found in review: release_ticket released the ticket on the cache that issued it, whichever
    # cache was asked, and marked it released before trying.
    a, b = make_cache(), make_cache()
    a.create_sequence(1)
    a.append(1, tokens(20))
    t = a.ensure_resident(1, 0, 20)
    with pytest.raises(kvtier.NotFoundError, match="another cache"):
        b.release_ticket(t)
    a.release_ticket(t)  # still open after the refusal
    with pytest.raises(kvtier.FailedPreconditionError):
        a.release_ticket(t)


def test_a_tier_stack_for_another_namespace_is_refused():
    # Found in review: a stack built for another namespace with blocks of the same size (other
    # tokens per block and heads) was taken, and its pool read with this namespace's shape.
    ns = make_namespace()  # 2 layers, 2 heads of 8, fp16, 16 tokens a block
    g = kvtier.KvGeometry(num_layers=2, num_kv_heads=1, head_dim=8, dtype=kvtier.KvDtype.FP16,
                          tokens_per_block=2 * B)
    other = kvtier.CacheNamespace(g, model_id="test-model", weights_fingerprint="w1")
    assert g.bytes_per_block == ns.geometry.bytes_per_block
    with pytest.raises(kvtier.InvalidArgumentError, match="build the tier stack for this"):
        kvtier.KvCache.create(ns, kvtier.TierStack(other, hbm_blocks=8, dram_blocks=16))


def test_ticket_is_a_context_manager_with_an_int32_block_table():
    cache = make_cache()
    cache.create_sequence(1)
    cache.append(1, tokens(40))
    with cache.ensure_resident(1, 0, 40) as t:
        table = t.block_table
        assert table.dtype == np.int32 and table.shape == (3,)
        assert (table >= 0).all() and len(set(table.tolist())) == 3
        assert t.first_block == 0 and t.tokens_per_block == B and t.tokens_in_last_block == 8
        assert t.block_status == [kvtier.BlockResidency.RESIDENT] * 3
        assert t.block_error(0) is None
        with pytest.raises(kvtier.OutOfRangeError):  # before, returned as if a block's cause
            t.block_error(3)
        with pytest.raises(kvtier.OutOfRangeError):
            t.block_error(-1)
        assert t.resident_tokens == 40
        assert t.completion.done and t.completion.ok and t.completion.error is None
        assert t.sequence == 1 and (t.begin_token, t.end_token) == (0, 40)
        stats = cache.stats()
        assert stats.open_tickets == 1
        assert stats.tier(kvtier.Tier.HBM).locked_blocks == 3
        assert not t.released
    assert t.released
    stats = cache.stats()
    assert stats.open_tickets == 0 and stats.tier(kvtier.Tier.HBM).locked_blocks == 0
    with pytest.raises(kvtier.FailedPreconditionError):
        t.release()
    t2 = cache.ensure_resident(1, 16, 40)
    assert t2.first_block == 1 and len(t2.block_table) == 2
    cache.release_ticket(t2)
    assert t2.released
    with cache.ensure_resident(1, 0, 40) as t3:
        t3.release()  # an early release inside the block: the exit does not release twice
    cache.check_invariants()


def test_fork_shares_full_blocks_and_copies_a_partial_one():
    cache = make_cache()
    cache.create_sequence(1)
    cache.append(1, tokens(20))
    with cache.ensure_resident(1, 0, 20) as t:
        parent_slots = t.block_table.tolist()
        cache.report_written(1, 20)
    assert cache.fork(1, 2, 16) is None
    copy = cache.fork(1, 3, 20)
    assert copy is not None
    assert copy.src == parent_slots[1] and copy.dst != copy.src and copy.num_tokens == 4
    assert cache.get_sequence(3).num_tokens == 20
    assert cache.get_sequence(2).num_blocks == 1
    with pytest.raises(kvtier.AlreadyExistsError):
        cache.fork(1, 2, 4)
    with pytest.raises(kvtier.OutOfRangeError):
        cache.fork(1, 4, 21)
    cache.check_invariants()


def test_release_hints_are_answered():
    cache = make_cache(eviction_policy="reuse_index")
    cache.create_sequence(1, session=42)
    cache.append(1, tokens(40))
    cache.report_written(1, 40)
    out = cache.release(1, stop_reason=kvtier.StopReason.TOOL_USE, expected_idle_s=5.0)
    assert out.result == kvtier.HintResult.ACCEPTED and out.blocks == 2
    cache.create_sequence(2)  # no session: nothing to tie the hint to
    cache.append(2, tokens(20, seed=2))
    out = cache.release(2, stop_reason=kvtier.StopReason.END_TURN)
    assert out.result == kvtier.HintResult.REJECTED and out.reason
    with pytest.raises(kvtier.NotFoundError):
        cache.release(3, stop_reason=kvtier.StopReason.LENGTH)
    # last_turn: the session sends nothing more; an idle estimate beside it is not used.
    cache.create_sequence(4, session=43)
    cache.append(4, tokens(40, seed=4))
    cache.report_written(4, 40)
    out = cache.release(4, stop_reason=kvtier.StopReason.END_TURN, expected_idle_s=30.0,
                        last_turn=True)
    assert out.result == kvtier.HintResult.CLIPPED and "last_turn" in out.reason
    assert out.blocks == 2


@pytest.mark.parametrize("by_value", [True, False])
def test_a_victim_not_worth_restoring_is_dropped(by_value):
    cache = make_cache(eviction_policy="reuse_index", demote_by_value=by_value)
    a, b = tokens(B, seed=11), tokens(B, seed=12)
    cache.create_sequence(1, session=7)
    cache.append(1, a)
    cache.report_written(1, B)
    cache.release(1, stop_reason=kvtier.StopReason.TOOL_USE)
    # The session comes back without block a (a compaction): a is not worth keeping below.
    serve(cache, 2, b, session=7)
    serve(cache, 3, tokens(8 * B, seed=13))  # every HBM slot: a and b go
    cache.wait_idle(timeout_s=30)
    hbm = cache.stats().tier(kvtier.Tier.HBM)
    assert cache.lookup(b).matched_tokens == B  # demoted to DRAM
    if by_value:
        assert hbm.value_drops == 1
        assert cache.lookup(a).matched_tokens == 0
    else:
        assert hbm.value_drops == 0
        assert cache.lookup(a).matched_tokens == B
    assert hbm.policy_shadow_us == 0 and hbm.policy_leader_changes == 0  # no shadows here
    assert hbm.policy_shadow_accesses == 0
    cache.check_invariants()


def test_learned_shadows_sample_the_blocks_an_attach_names():
    # A tier of 8 blocks samples an eighth of the keys (eviction_policy.h): about 8 of 64.
    cache = make_cache(eviction_policy="learned")
    cache.create_sequence(1)
    cache.attach_prefix(1, tokens(64 * B + 1))
    cache.release(1)
    stats = cache.stats()
    sampled = stats.tier(kvtier.Tier.HBM).policy_shadow_accesses
    assert 0 < sampled <= 24
    assert stats.as_dict()["tiers"]["hbm"]["policy_shadow_accesses"] == sampled


def test_pause_moves_references_down_and_resume_brings_them_back():
    cache = make_cache()
    cache.create_sequence(1, session=1)
    cache.append(1, tokens(40))
    cache.report_written(1, 40)
    cache.pause(1, expected_idle_s=9.0)
    assert cache.get_sequence(1).paused
    with pytest.raises(kvtier.FailedPreconditionError):
        cache.pause(1, 1.0)
    cache.wait_idle(timeout_s=30)
    assert cache.stats().tier(kvtier.Tier.DRAM).stored == 2
    assert cache.get_sequence(1).blocks_by_tier[int(kvtier.Tier.DRAM)] == 2
    done = cache.resume(1)
    done.wait(timeout_s=30)
    info = cache.get_sequence(1)
    assert not info.paused and info.written_tokens == 40 and info.num_blocks == 3
    with pytest.raises(kvtier.FailedPreconditionError):
        cache.resume(1)
    cache.check_invariants()


def test_report_written_waits_for_the_kernel_completion():
    cache = make_cache()
    prompt = tokens(32)
    cache.create_sequence(1)
    cache.append(1, prompt)
    kernel_done = kvtier.Completion()
    assert not kernel_done.done
    cache.report_written(1, 32, kernel_done)
    assert cache.lookup(prompt).matched_tokens == 0  # not readable before the kernel is done
    with pytest.raises(kvtier.InvalidArgumentError):  # before, fired as UNKNOWN
        kernel_done.complete(42, "not a status code")
    assert not kernel_done.done
    assert kernel_done.complete()
    assert not kernel_done.complete(13, "second outcome loses")
    assert kernel_done.ok
    assert cache.lookup(prompt).matched_tokens == 32


def test_retain_invalidate_and_prefetch():
    cache = make_cache()
    prompt = tokens(40)
    serve(cache, 1, prompt)
    out = cache.retain_prefix(prompt, 1.0, 60.0)
    assert out.result == kvtier.HintResult.ACCEPTED and out.blocks == 2
    assert cache.retain_prefix(prompt, -1.0, 60.0).result == kvtier.HintResult.REJECTED
    assert cache.prefetch(tokens(40, seed=9)) == 0  # nothing cached to onboard
    out = cache.invalidate_prefix(prompt, from_token=16)
    assert out.result == kvtier.HintResult.ACCEPTED and out.blocks == 1
    assert cache.lookup(prompt).matched_tokens == 16
    assert cache.invalidate_prefix(prompt, from_token=-1).result == kvtier.HintResult.REJECTED


def test_session_hints_act_on_the_sessions_released_blocks():
    cache = make_cache()
    cache.create_sequence(1, session=5)
    cache.append(1, tokens(40))
    cache.report_written(1, 40)
    cache.release(1)
    out = cache.retain_session(5, 1.0, 60.0)
    assert out.result == kvtier.HintResult.ACCEPTED and out.blocks == 2
    assert cache.retain_session(6, 1.0, 60.0).result == kvtier.HintResult.REJECTED
    out = cache.invalidate_session(5)
    assert out.result == kvtier.HintResult.ACCEPTED and out.blocks == 2
    assert cache.lookup(tokens(40)).matched_tokens == 0
    assert cache.invalidate_session(5).result == kvtier.HintResult.REJECTED  # forgotten


def test_events_outlive_their_cache():
    # Found in review: an event's worker_id and adapter_id were views into the cache, read after
    # it was freed; another cache made since takes the freed memory.
    cache = make_cache(worker_id="a" * 200)
    serve(cache, 1, tokens(40))
    events = cache.poll_events()
    assert events
    del cache
    gc.collect()
    others = [make_cache(worker_id="b" * 200) for _ in range(4)]
    for c in others:
        serve(c, 1, tokens(40))
    assert all(e.worker_id == "a" * 200 and e.adapter_id == "" for e in events)


def test_events_and_stats_agree():
    cache = make_cache(worker_id="host3:gpu1")
    serve(cache, 1, tokens(40))
    events = cache.poll_events()
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    stored_hbm = [e for e in events
                  if e.kind == kvtier.CacheEventKind.STORED and e.tier == kvtier.Tier.HBM]
    assert len(stored_hbm) == 2 and len({e.key for e in stored_hbm}) == 2
    # The router fields: the chain's parent keys, the block size, the worker, no adapter.
    assert stored_hbm[0].parent_key is None and not stored_hbm[0].has_parent
    assert stored_hbm[1].parent_key == stored_hbm[0].key and stored_hbm[1].has_parent
    assert all(e.num_tokens == B and e.worker_id == "host3:gpu1" and e.adapter_id == ""
               for e in events)
    assert all(len(e.key) == 32 for e in events)
    stats = cache.stats()
    assert stats.last_event_sequence == events[-1].sequence
    assert stats.tier(kvtier.Tier.HBM).stored == 2
    assert cache.poll_events(after_sequence=events[-1].sequence) == []
    assert len(cache.poll_events(max_events=1)) == 1
    d = stats.as_dict()
    assert d["tiers"]["hbm"]["stored"] == 2 and d["tiers"]["nvme"]["present"] is False
    assert d["blocks_moved"][0][1] == stats.moved(kvtier.Tier.HBM, kvtier.Tier.DRAM)
    hbm = stats.tiers[0]
    assert hbm.capacity_blocks == 8
    assert (hbm.free_blocks + hbm.locked_blocks + hbm.held_blocks + hbm.droppable_blocks
            + hbm.in_flight_blocks + hbm.quarantined_blocks) == 8
    assert "kvtier_" in stats.prometheus()


def test_tier_stack_options_and_consumption(tmp_path):
    ns = make_namespace()
    stack = kvtier.TierStack(ns, hbm_blocks=4, dram_blocks=4, nvme_blocks=8,
                             nvme_path=str(tmp_path / "kv.nvme"), remote_blocks=8,
                             remote_directory=str(tmp_path / "remote"))
    assert stack.capacity_blocks(kvtier.Tier.NVME) == 8
    assert stack.backend_name(kvtier.Tier.HBM).startswith("emulated_hbm")
    cache = kvtier.KvCache.create(ns, stack, write_policy=kvtier.WritePolicy.WRITE_THROUGH)
    assert stack.consumed and stack.capacity_blocks(kvtier.Tier.HBM) == 0
    with pytest.raises(kvtier.FailedPreconditionError):
        kvtier.KvCache.create(ns, stack)
    assert [t.present for t in cache.stats().tiers] == [True, True, True, True]
    serve(cache, 1, tokens(32))
    cache.wait_idle(timeout_s=30)
    assert cache.stats().tier(kvtier.Tier.DRAM).stored == 2  # write-through: one tier down
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.TierStack(ns, hbm_blocks=-1)
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.KvCache.create(ns, kvtier.TierStack(ns, hbm_blocks=4), eviction_policy="nope")


def test_a_prompt_hashed_once_serves_lookup_and_attach():
    cache = make_cache()
    prompt = tokens(40)
    serve(cache, 1, prompt)
    hashed = cache.hash_prompt(prompt)
    assert len(hashed.keys) == 2 and all(len(k) == 32 for k in hashed.keys)
    assert (hashed.tokens == prompt).all()
    assert cache.lookup_hashed(hashed).matched_tokens == 32
    cache.create_sequence(2)
    assert cache.attach_hashed_prefix(2, hashed).attached_tokens == 32
    cache.create_sequence(3, tenant_salt="other")
    with pytest.raises(kvtier.InvalidArgumentError):
        cache.attach_hashed_prefix(3, hashed)  # hashed under another identity
    stored = {e.key for e in cache.poll_events() if e.kind == kvtier.CacheEventKind.STORED}
    assert set(hashed.keys) <= stored


# ---- The scheduler calls (tests/unit/cache/scheduler_api_test.cc in Python form)


def add(cache, seq, toks, written, **create):
    """Creates seq, appends toks and reports the first `written` of them written."""
    cache.create_sequence(seq, **create)
    cache.append(seq, toks)
    if written > 0:
        cache.report_written(seq, written)


def free_hbm(cache):
    return cache.stats().tier(kvtier.Tier.HBM).free_blocks


def test_truncate_inside_a_full_block_returns_a_copy_of_its_head():
    cache = make_cache(hbm=16)
    toks = tokens(2 * B + 2, seed=3)  # blocks 0, 1 full; 2 partial
    add(cache, 1, toks, len(toks))
    with cache.ensure_resident(1, 0, len(toks)) as t:
        slots = t.block_table.tolist()
    free_before = free_hbm(cache)
    copy = cache.truncate(1, B + 2)
    assert isinstance(copy, kvtier.BlockCopy)
    assert copy.num_tokens == (B + 2) % B == 2
    assert copy.src == slots[1] and copy.dst != copy.src
    info = cache.get_sequence(1)
    assert (info.num_tokens, info.written_tokens, info.num_blocks) == (B + 2, B + 2, 2)
    # The old partial block freed, the copy's slot taken; the cut block stays indexed.
    assert free_hbm(cache) == free_before
    assert cache.lookup(toks[:2 * B]).matched_tokens == 2 * B
    cache.check_invariants()
    # The sequence goes on from the cut.
    cache.append(1, tokens(B, seed=4))
    cache.report_written(1, 2 * B + 2)
    cache.check_invariants()
    # At a block boundary nothing is copied; past the end or negative is out of range.
    assert cache.truncate(1, B) is None
    assert cache.get_sequence(1).num_blocks == 1
    with pytest.raises(kvtier.OutOfRangeError):
        cache.truncate(1, B + 1)
    with pytest.raises(kvtier.OutOfRangeError):
        cache.truncate(1, -1)
    with pytest.raises(kvtier.NotFoundError):
        cache.truncate(7, 0)
    cache.release(1)
    cache.check_invariants()


def test_no_wait_calls_raise_resource_exhausted_when_hbm_is_held():
    # room_wait is long: a call that waited would hold the test for a minute.
    cache = make_cache(hbm=8, room_wait_s=60.0)
    add(cache, 1, tokens(8 * B, seed=5), 0)  # every HBM slot held
    cache.create_sequence(2)
    start = time.monotonic()
    with pytest.raises(kvtier.ResourceExhaustedError) as e:
        cache.append(2, tokens(B, seed=6), wait=kvtier.RoomWait.NEVER)
    assert e.value.code_name == "RESOURCE_EXHAUSTED"
    info = cache.get_sequence(2)
    assert info.num_tokens == 0 and info.num_blocks == 0  # nothing changed
    with pytest.raises(kvtier.ResourceExhaustedError):
        cache.fork(1, 3, B + 1, wait=kvtier.RoomWait.NEVER)
    with pytest.raises(kvtier.ResourceExhaustedError):
        cache.truncate(1, B + 1, wait=kvtier.RoomWait.NEVER)
    assert time.monotonic() - start < 30.0  # none of them waited out room_wait
    assert cache.get_sequence(1).num_tokens == 8 * B
    with pytest.raises(kvtier.NotFoundError):
        cache.get_sequence(3)
    room = cache.check_room(seq=2, num_new_tokens=B)
    assert room.needed_slots == 1 and room.free_slots == 0 and room.missing_slots == 1
    assert not room.fits_now and not room.fits_after_evictions
    cache.check_invariants()


def test_no_wait_append_drops_what_can_go_at_once():
    cache = make_cache(hbm=8, dram=0)  # no tier below HBM: evicting is dropping
    add(cache, 1, tokens(8 * B, seed=7), 8 * B)
    cache.release(1)
    cache.create_sequence(2)
    out = cache.append(2, tokens(3 * B, seed=8), wait=kvtier.RoomWait.NEVER)
    assert out.num_new_slots == 3
    assert cache.stats().tier(kvtier.Tier.HBM).evictions == 3


def test_check_room_counts_free_evictable_and_missing_slots():
    cache = make_cache(hbm=16)
    add(cache, 1, tokens(4 * B, seed=9), 4 * B)
    cache.release(1)  # 4 cached blocks
    add(cache, 2, tokens(4 * B - 1, seed=10), 0)  # 4 held, the last partial
    r = cache.check_room(num_slots=10)
    assert (r.needed_slots, r.free_slots, r.evictable_slots, r.demotions_in_flight) == (10, 8, 4, 0)
    assert not r.fits_now and r.fits_after_evictions and r.missing_slots == 0
    assert "needed_slots=10" in repr(r)
    r = cache.check_room(num_slots=14)
    assert not r.fits_after_evictions and r.missing_slots == 2
    # One more token fills sequence 2's partial block; two more need a new slot.
    r = cache.check_room(seq=2, num_new_tokens=1)
    assert r.needed_slots == 0 and r.fits_now
    assert cache.check_room(seq=2, num_new_tokens=2).needed_slots == 1
    with pytest.raises(kvtier.InvalidArgumentError):
        cache.check_room(num_slots=-1)
    with pytest.raises(kvtier.InvalidArgumentError):
        cache.check_room(seq=2, num_new_tokens=-1)
    with pytest.raises(kvtier.NotFoundError):
        cache.check_room(seq=9, num_new_tokens=1)
    with pytest.raises(kvtier.InvalidArgumentError):
        cache.check_room()  # neither form
    with pytest.raises(kvtier.InvalidArgumentError):
        cache.check_room(seq=2, num_new_tokens=1, num_slots=1)  # both forms


def test_reset_prefix_cache_drops_released_blocks_and_says_all_cleared():
    cache = make_cache(hbm=16, dram=16)
    released, held = tokens(3 * B, seed=11), tokens(2 * B, seed=12)
    add(cache, 1, released, 3 * B)
    cache.release(1)
    add(cache, 2, held, 2 * B)
    after = cache.stats().last_event_sequence
    assert cache.reset_prefix_cache() == 3
    assert cache.lookup(released).matched_tokens == 0
    assert cache.lookup(held).matched_tokens == 2 * B  # held blocks stay
    events = cache.poll_events(after_sequence=after)
    assert sum(e.kind == kvtier.CacheEventKind.REMOVED for e in events) == 3
    cleared = [e.tier for e in events if e.kind == kvtier.CacheEventKind.ALL_CLEARED]
    assert cleared == [kvtier.Tier.HBM, kvtier.Tier.DRAM]  # one per present tier
    assert events[-1].kind == kvtier.CacheEventKind.ALL_CLEARED
    assert "ALL_CLEARED" in repr(events[-1])
    # One tier; a tier the cache does not have.
    assert cache.reset_prefix_cache(tier=kvtier.Tier.DRAM) == 0
    with pytest.raises(kvtier.InvalidArgumentError):
        cache.reset_prefix_cache(kvtier.Tier.NVME)
    cache.check_invariants()


def test_a_sequence_with_caching_off_is_never_matched():
    cache = make_cache(hbm=16)
    toks = tokens(3 * B, seed=13)
    free_before = free_hbm(cache)
    add(cache, 1, toks, 3 * B, enable_caching=False)
    assert cache.lookup(toks).matched_tokens == 0
    with pytest.raises(kvtier.FailedPreconditionError):
        cache.pause(1, 1.0)
    cache.release(1)
    assert free_hbm(cache) == free_before  # private blocks: freed
    assert cache.stats().indexed_blocks == 0
    # Cached by another sequence, still not attached to one with caching off.
    serve(cache, 2, toks)
    cache.create_sequence(3, enable_caching=False)
    query = np.append(toks, np.int32(7))
    assert cache.attach_prefix(3, query).attached_tokens == 0
    assert cache.lookup(toks).matched_tokens == 3 * B
    cache.check_invariants()


def test_a_swap_preemption_is_a_counted_pause_and_resumes():
    cache = make_cache(hbm=16, dram=16)
    cache.create_sequence(1, session=7)
    cache.append(1, tokens(2 * B, seed=15))
    cache.report_written(1, 2 * B)
    out = cache.pause(1, preempted=True)
    assert out.result == kvtier.HintResult.ACCEPTED and out.blocks == 2
    assert cache.stats().preemptions == 1 and cache.get_sequence(1).paused
    cache.resume(1).wait(timeout_s=30)
    out = cache.pause(1)  # a tool wait of unknown length
    assert out.result == kvtier.HintResult.ACCEPTED
    assert cache.stats().preemptions == 1
    cache.resume(1).wait(timeout_s=30)
    cache.release(1)


def test_a_readmission_after_preemption_counts_readmitted_blocks_not_hits():
    cache = make_cache(hbm=16)
    toks = tokens(3 * B, seed=14)
    add(cache, 1, toks, 3 * B)
    assert isinstance(cache.release(1, preempted=True), kvtier.HintOutcome)
    query = np.append(toks, np.int32(7))
    cache.create_sequence(2, readmission=True)
    assert cache.attach_prefix(2, query).attached_tokens == 3 * B
    s = cache.stats()
    assert s.preemptions == 1 and s.readmitted_blocks == 3
    assert s.tier(kvtier.Tier.HBM).hits == 0
    assert s.as_dict()["preemptions"] == 1 and s.as_dict()["readmitted_blocks"] == 3
    # Another request's attach of the same blocks is a hit.
    cache.create_sequence(3)
    cache.attach_prefix(3, query)
    s = cache.stats()
    assert s.tier(kvtier.Tier.HBM).hits == 3 and s.readmitted_blocks == 3
    assert s.preemptions == 1
