"""Layer-wise residency from Python (ResidencyTicket.layer_ready / stream_wait), the CUDA-event
completion and the CUDA HBM backend where they cannot work here (no GPU: their errors), and an
engine's own torch tensors registered as the HBM pool in vLLM's FlashAttention layout
(LAYER_KV_SPLIT), written by kvtier in place."""
import numpy as np
import pytest

import kvtier

B = 16
L, H, D = 3, 2, 8


def make_namespace(layout=kvtier.HbmLayout.LAYER_FIRST):
    g = kvtier.KvGeometry(num_layers=L, num_kv_heads=H, head_dim=D, dtype=kvtier.KvDtype.FP16,
                          tokens_per_block=B)
    return kvtier.CacheNamespace(g, model_id="test-model", weights_fingerprint="w",
                                 hbm_layout=layout)


def tokens(n, seed=0):
    return np.random.default_rng(seed).integers(0, 50000, n, dtype=np.int32)


def write_prompt_to_dram(cache, pool, prompt, seq=1):
    """Sequence `seq` computes `prompt`'s full blocks (random KV through the pool), releases
    them, and they are dropped from HBM: only DRAM (write-through) keeps them. The KV written,
    per block index, as pool.layer(l)[slot] arrays indexed [layer]."""
    n = len(prompt) // B * B
    cache.create_sequence(seq)
    cache.append(seq, prompt[:n])
    rng = np.random.default_rng(seq)
    written = []
    with cache.ensure_resident(seq, 0, n) as t:
        for slot in t.block_table:
            per_layer = []
            for layer in range(L):
                values = rng.standard_normal((2, B, H, D)).astype(np.float16)
                pool.layer(layer)[slot] = values
                per_layer.append(values)
            written.append(per_layer)
        cache.report_written(seq, n)
    cache.release(seq)
    cache.wait_idle(10.0)
    cache.reset_prefix_cache(kvtier.Tier.HBM)
    return written


def test_each_layer_is_ready_before_the_whole_ticket_and_reads_back():
    ns = make_namespace()
    cache = kvtier.KvCache.create(ns, kvtier.TierStack(ns, hbm_blocks=8, dram_blocks=16),
                                  write_policy=kvtier.WritePolicy.WRITE_THROUGH)
    pool = cache.hbm_pool
    prompt = tokens(3 * B + 1)
    written = write_prompt_to_dram(cache, pool, prompt)
    cache.create_sequence(2)
    assert cache.attach_prefix(2, prompt).attached_tokens == 3 * B
    with cache.ensure_resident(2, 0, 3 * B, mode=kvtier.ResidencyMode.ASYNC) as t:
        assert t.num_layers == L
        for layer in range(L):
            t.layer_ready(layer).wait(10.0)
            t.stream_wait(0, layer, 10.0)  # emulated HBM: a host wait, already satisfied
            table = t.block_table  # final for this layer once it is ready
            for i, slot in enumerate(table):
                assert slot >= 0
                np.testing.assert_array_equal(pool.layer(layer)[slot], written[i][layer])
        t.completion.wait(10.0)
        assert t.layer_ready(0).ok
        with pytest.raises(kvtier.OutOfRangeError):
            t.layer_ready(L).wait(0.0)
        with pytest.raises(kvtier.OutOfRangeError):
            t.stream_wait(0, L, 1.0)
    cache.release(2)


def test_cuda_event_and_cuda_backend_say_why_not_here():
    ns = make_namespace()
    cache = kvtier.KvCache.create(ns, kvtier.TierStack(ns, hbm_blocks=4))
    with pytest.raises(kvtier.UnimplementedError):
        cache.completion_of_cuda_event(0x1234)
    with pytest.raises(kvtier.InvalidArgumentError):
        cache.completion_of_cuda_event(0)
    assert cache.hbm_pool.host_accessible
    try:
        stack = kvtier.TierStack(ns, hbm_blocks=4, hbm_backend="cuda")
    except (kvtier.UnavailableError, kvtier.UnimplementedError) as e:
        assert "CUDA" in str(e) or "cuda" in str(e)
    else:  # a GPU answers: the pool is device memory the CPU cannot view
        pool = kvtier.KvCache.create(ns, stack).hbm_pool
        assert not pool.host_accessible
        iface = pool.cuda_array_interface(0, 0)
        assert iface["shape"] == (4, B, H, D) and iface["version"] == 3
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.TierStack(ns, hbm_blocks=4, hbm_backend="tpu")


def test_registered_torch_tensors_in_the_flash_attention_layout_are_the_pool():
    torch = pytest.importorskip("torch")
    ns = make_namespace(kvtier.HbmLayout.LAYER_KV_SPLIT)
    blocks = 4
    # vLLM FlashAttention: kv_cache[layer] is [2, num_blocks, block_size, num_kv_heads, head_size].
    engine = [torch.zeros(2, blocks, B, H, D, dtype=torch.float16) for _ in range(L)]
    cache = kvtier.KvCache.create(
        ns, kvtier.TierStack(ns, hbm_blocks=blocks, dram_blocks=8, hbm_tensors=engine),
        write_policy=kvtier.WritePolicy.WRITE_THROUGH)
    pool = cache.hbm_pool
    assert pool.layout == kvtier.HbmLayout.LAYER_KV_SPLIT
    assert pool.address == engine[0].data_ptr()
    # One allocation per layer: the flat views, which ran past tensor 0, are empty or refused.
    flat = memoryview(pool)
    assert flat.nbytes == 0 and flat.readonly
    flat.release()
    with pytest.raises(kvtier.FailedPreconditionError):
        pool.array()
    with pytest.raises(kvtier.FailedPreconditionError):
        pool.layer_offset_bytes(1)
    prompt = tokens(2 * B + 1, seed=3)
    written = write_prompt_to_dram(cache, pool, prompt)  # through kvtier's views of the tensors
    cache.create_sequence(2)
    cache.attach_prefix(2, prompt)
    with cache.ensure_resident(2, 0, 2 * B) as t:
        for i, slot in enumerate(t.block_table):
            for layer in range(L):
                k, v = engine[layer][0, slot].numpy(), engine[layer][1, slot].numpy()
                np.testing.assert_array_equal(k, written[i][layer][0])
                np.testing.assert_array_equal(v, written[i][layer][1])
    cache.release(2)
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.TierStack(ns, hbm_blocks=blocks, hbm_tensors=engine[:1])
    with pytest.raises(kvtier.InvalidArgumentError):
        small = [torch.zeros(2, 1, B, H, D, dtype=torch.float16) for _ in range(L)]
        kvtier.TierStack(ns, hbm_blocks=blocks, hbm_tensors=small)
    # Found in review: a tensor's device was not checked, so host tensors went to the CUDA
    # backend (and CUDA tensors to the emulated one, which memcpys through their addresses).
    with pytest.raises(kvtier.InvalidArgumentError, match="not a CUDA tensor"):
        kvtier.TierStack(ns, hbm_blocks=blocks, hbm_tensors=engine, hbm_backend="cuda")
