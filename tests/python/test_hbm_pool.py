"""The emulated HBM pool seen from Python without a copy: its buffer, its numpy views in each
layout, torch tensors over it, and K/V bytes written for a block that survive an eviction to a
lower tier (DRAM or NVMe) and come back, bit for bit, through the new block table."""
import gc

import numpy as np
import pytest

import kvtier

B = 16
L, H, D = 3, 2, 8
LAYOUTS = [kvtier.HbmLayout.LAYER_FIRST, kvtier.HbmLayout.BLOCK_FIRST,
           kvtier.HbmLayout.LAYER_KV_SPLIT]


def make_cache(layout, dtype=kvtier.KvDtype.FP16, hbm=4, **tiers):
    g = kvtier.KvGeometry(num_layers=L, num_kv_heads=H, head_dim=D, dtype=dtype,
                          tokens_per_block=B)
    ns = kvtier.CacheNamespace(g, model_id="test-model", weights_fingerprint="w",
                               hbm_layout=layout)
    return kvtier.KvCache.create(ns, kvtier.TierStack(ns, hbm_blocks=hbm, **tiers))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pool_views_share_memory_in_the_documented_layout(layout):
    cache = make_cache(layout, dram_blocks=4)
    pool = cache.hbm_pool
    g = pool.geometry
    assert pool.layout == layout and pool.num_blocks == 4
    flat = memoryview(pool)
    assert not flat.readonly and flat.nbytes == pool.nbytes == 4 * g.bytes_per_block
    whole = pool.array()
    if layout == kvtier.HbmLayout.LAYER_FIRST:
        assert whole.shape == (L, 4, 2, B, H, D)
    elif layout == kvtier.HbmLayout.BLOCK_FIRST:
        assert whole.shape == (4, L, 2, B, H, D)
    else:  # vLLM FlashAttention: K of every slot, then V of every slot, per layer
        assert whole.shape == (L, 2, 4, B, H, D)
    assert whole.dtype == np.float16 and whole.flags.c_contiguous and whole.flags.writeable
    assert pool.layer(1).shape == (4, 2, B, H, D)
    assert pool.k(1).shape == pool.v(1).shape == (4, B, H, D)
    # One element written through layer(l) is where the layout says, in the flat bytes.
    slot, layer, plane, token, head = 3, 1, 1, 5, 1
    pool.layer(layer)[slot, plane, token, head, :] = np.arange(D, dtype=np.float16) + 1
    if layout == kvtier.HbmLayout.LAYER_FIRST:
        outer = (layer * 4 + slot) * 2 + plane
    elif layout == kvtier.HbmLayout.BLOCK_FIRST:
        outer = (slot * L + layer) * 2 + plane
    else:
        outer = (layer * 2 + plane) * 4 + slot
    elem = (outer * B + token) * H * D + head * D
    raw = np.frombuffer(flat, dtype=np.float16)
    np.testing.assert_array_equal(raw[elem:elem + D], np.arange(D, dtype=np.float16) + 1)
    assert pool.v(layer)[slot, token, head, 0] == 1
    assert pool.layer_offset_bytes(0) == 0
    assert pool.block_stride_bytes == {
        kvtier.HbmLayout.LAYER_FIRST: g.bytes_per_block_per_layer,
        kvtier.HbmLayout.BLOCK_FIRST: g.bytes_per_block,
        kvtier.HbmLayout.LAYER_KV_SPLIT: g.bytes_per_block_per_layer // 2}[layout]
    with pytest.raises(kvtier.OutOfRangeError):
        pool.layer(L)


def test_a_view_keeps_the_cache_alive():
    view = make_cache(kvtier.HbmLayout.LAYER_FIRST).hbm_pool.k(0)
    gc.collect()
    view[...] = 2  # the cache (and its pool) lives while a view does
    assert (view == 2).all()


def write_blocks(pool, slots, rng, use_torch):
    """Random K/V for every layer of each slot; what was written, per (layer, block)."""
    written = {}
    for layer in range(L):
        for i, slot in enumerate(slots):
            values = rng.standard_normal((2, B, H, D)).astype(np.float16)
            if use_torch:
                import torch
                pool.tensor(layer=layer, plane=0)[slot] = torch.from_numpy(values[0])
                pool.tensor(layer=layer, plane=1)[slot] = torch.from_numpy(values[1])
            else:
                pool.layer(layer)[slot] = values
            written[(layer, i)] = values
    return written


def round_trip(layout, lower, use_torch, tmp_path):
    tiers = {"dram_blocks": 16} if lower == kvtier.Tier.DRAM else {
        "nvme_blocks": 16, "nvme_path": str(tmp_path / "kv.nvme")}
    cache = make_cache(layout, hbm=4, **tiers)
    pool = cache.hbm_pool
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, 50000, 32, dtype=np.int32)

    # Turn 1: two blocks computed into HBM ("the kernel" writes their K/V), then released.
    cache.create_sequence(1)
    assert cache.attach_prefix(1, prompt).attached_tokens == 0
    cache.append(1, prompt)
    with cache.ensure_resident(1, 0, 32) as ticket:
        written = write_blocks(pool, ticket.block_table.tolist(), rng, use_torch)
        cache.report_written(1, 32)
    cache.release(1)

    # Another sequence takes every HBM slot: the two blocks are demoted to the lower tier.
    cache.create_sequence(2)
    cache.append(2, rng.integers(0, 50000, 4 * B, dtype=np.int32))
    cache.release(2)
    cache.wait_idle(timeout_s=30)
    stats = cache.stats()
    assert stats.tier(kvtier.Tier.HBM).demotions == 2
    assert stats.tier(lower).stored == 2
    assert stats.moved(kvtier.Tier.HBM, lower) == 2
    assert cache.lookup(prompt).blocks_by_tier[int(lower)] == 2
    pool.array()[...] = 0  # nothing of turn 1's bytes is left in HBM

    # Turn 2 attaches the prefix and onboards it: the bytes come back through the new table.
    cache.create_sequence(3)
    turn2 = np.concatenate([prompt, np.array([11], dtype=np.int32)])
    hit = cache.attach_prefix(3, turn2)
    assert hit.attached_tokens == 32
    assert hit.attached_blocks_by_tier[int(lower)] == 2
    cache.append(3, turn2[32:])
    with cache.ensure_resident(3, 0, 33) as ticket:
        assert ticket.completion.ok and ticket.resident_tokens == 33
        slots = ticket.block_table.tolist()
        for (layer, i), values in written.items():
            if use_torch:
                import torch
                got = torch.stack([pool.tensor(layer=layer, plane=0)[slots[i]],
                                   pool.tensor(layer=layer, plane=1)[slots[i]]]).numpy()
            else:
                got = pool.layer(layer)[slots[i]]
            np.testing.assert_array_equal(got.view(np.uint16), values.view(np.uint16))
        cache.report_written(3, 33)
    stats = cache.stats()
    assert stats.moved(lower, kvtier.Tier.HBM) == 2
    assert stats.tier(lower).hits == 2
    assert stats.tier(lower).bytes_out == 2 * pool.geometry.bytes_per_block
    cache.check_invariants()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("lower", [kvtier.Tier.DRAM, kvtier.Tier.NVME])
def test_block_bytes_round_trip_through_a_lower_tier(layout, lower, tmp_path):
    round_trip(layout, lower, use_torch=False, tmp_path=tmp_path)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_torch_views_round_trip_through_dram(layout, tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")
    round_trip(layout, kvtier.Tier.DRAM, use_torch=True, tmp_path=tmp_path)


def test_torch_tensors_share_the_pool():
    torch = pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")
    cache = make_cache(kvtier.HbmLayout.LAYER_FIRST)
    pool = cache.hbm_pool
    k0 = pool.tensor(layer=0, plane=0)
    assert k0.dtype == torch.float16 and tuple(k0.shape) == (4, B, H, D)
    k0[2, 3] = 5.0
    assert (pool.k(0)[2, 3] == 5.0).all()
    flat = torch.frombuffer(pool, dtype=torch.uint8)
    assert flat.numel() == pool.nbytes
    assert tuple(pool.tensor().shape) == (L, 4, 2, B, H, D)
    bf16 = make_cache(kvtier.HbmLayout.BLOCK_FIRST, dtype=kvtier.KvDtype.BF16).hbm_pool
    v1 = bf16.tensor(layer=1, plane=1)
    assert v1.dtype == torch.bfloat16 and tuple(v1.shape) == (4, B, H, D)
    v1[0] = 1.5
    assert (bf16.v(1)[0] == 0x3FC0).all()  # 1.5 in bfloat16 bits


def test_cuda_array_interface_checks_its_plane():
    # Found by review: plane -5 was taken as the whole layer, and plane 2 of an MHA pool raised
    # FailedPreconditionError about MLA.
    pool = make_cache(kvtier.HbmLayout.LAYER_FIRST).hbm_pool
    assert pool.cuda_array_interface(0, -1)["shape"] == pool.layer(0).shape
    assert pool.cuda_array_interface(0, 1)["shape"] == pool.v(0).shape
    for plane in (-5, 2):
        with pytest.raises(kvtier.InvalidArgumentError, match="plane"):
            pool.cuda_array_interface(0, plane)


def test_a_cuda_views_holder_keeps_its_pool_alive(monkeypatch):
    # Found in review: tensor() of a CUDA pool built the tensor from a holder that referenced only
    # the interface dict, so the cache (owner of the device memory) could go first. Checked
    # without a GPU: torch.as_tensor is replaced, and the holder it is given is inspected.
    torch = pytest.importorskip("torch")

    class FakeCudaPool:
        host_accessible = False

        def __init__(self, geometry):
            self.geometry = geometry

        def cuda_array_interface(self, layer, plane):
            return {"shape": (1,), "typestr": "|u1", "data": (0, False), "version": 3}

    given = {}

    def as_tensor(obj, device=None):
        given["holder"] = obj
        given["device"] = device
        return torch.zeros(1, dtype=torch.uint8)

    monkeypatch.setattr(torch, "as_tensor", as_tensor)
    pool = FakeCudaPool(kvtier.KvGeometry(num_layers=1, num_kv_heads=1, head_dim=8,
                                          dtype=kvtier.KvDtype.FP16, tokens_per_block=4))
    kvtier.HbmPool.tensor(pool, 0)
    assert any(r is pool for r in gc.get_referents(vars(given["holder"])))
    # A view, not a copy: without a device torch.as_tensor returns a CPU copy of a CUDA array
    # interface object (pytorch/pytorch#54139). (A review of a073852, which dropped it.)
    assert given["device"] == "cuda"
