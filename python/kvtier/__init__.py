"""kvtier: a tiered KV-cache block manager for LLM inference, from Python.

The C++ API of include/kvtier/ (kv_cache.h is the contract) in Python form::

    import kvtier
    g = kvtier.KvGeometry(num_layers=4, num_kv_heads=2, head_dim=64,
                          dtype=kvtier.KvDtype.FP16, tokens_per_block=16)
    ns = kvtier.CacheNamespace(g, model_id="my-model", weights_fingerprint="v1")
    stack = kvtier.TierStack(ns, hbm_blocks=64, dram_blocks=256)
    cache = kvtier.KvCache.create(ns, stack)
    cache.create_sequence(1, session=7)
    hit = cache.attach_prefix(1, prompt)              # reuse the cached prefix
    cache.append(1, prompt[hit.attached_tokens:])     # slots for the rest
    with cache.ensure_resident(1, 0, len(prompt)) as ticket:
        table = ticket.block_table                    # int32 HBM slots, one per block
        k = cache.hbm_pool.tensor(layer=0, plane=0)   # torch view of layer 0's K, no copy
        ...                                           # attention reads/writes k[table[i]]
        cache.report_written(1, len(prompt))
    cache.release(1, stop_reason=kvtier.StopReason.TOOL_USE, expected_idle_s=9.0)

Conventions: sequence ids are ints; tokens are any 1-D sequence of integers that fit int32
(floats and larger values raise `kvtier.InvalidArgumentError`, never a lossy cast); durations
are float seconds (`*_s`); per-tier lists are indexed by `int(kvtier.Tier.X)`. A failed call
raises `kvtier.Error` (subclass per absl status code: `kvtier.NotFoundError`, ...) with `code`,
`code_name` and `message`.

For a scheduler: `append`, `fork` and `truncate` take `wait=kvtier.RoomWait.NEVER` (raise
`kvtier.ResourceExhaustedError`, nothing changed, while HBM is short instead of waiting);
`check_room(seq=..., num_new_tokens=...)` or `check_room(num_slots=...)` answers a `RoomCheck`;
`reset_prefix_cache(tier=None)` drops droppable copies; `create_sequence(...,
enable_caching=False)` keeps a sequence's blocks private; `release(..., preempted=True)` then
`create_sequence(..., readmission=True)` counts `stats().preemptions` and `readmitted_blocks`.

The HBM pool (`KvCache.hbm_pool`, the emulated HBM in host memory) is writable memory viewed
without a copy: the buffer protocol gives its bytes flat; `array()`, `layer(l)`, `k(l)`, `v(l)`
give numpy views in its layout (see `HbmPool`), and `tensor()` the same as torch tensors.
"""

from ._kvtier import *  # noqa: F401,F403  (the extension's public names)
from ._kvtier import Error, HbmPool, KvDtype  # noqa: F401

__all__ = [name for name in dir() if not name.startswith("_")]


def _pool_tensor(self, layer=None, plane=None):
    """This pool as a torch tensor sharing its memory (torch.from_numpy of a view).

    layer=None: the whole pool, array()'s shape. layer=l: layer(l)'s [num_blocks][P][B][H][D].
    plane=0 or 1 with a layer: k(l) or v(l), [num_blocks][B][H][D]. bf16 pools come back as
    torch.bfloat16 (numpy holds their bits as uint16); fp8 pools as uint8. A CUDA pool is viewed
    one layer at a time, on the current CUDA device (torch refuses a pool on another one).
    """
    import torch  # only this helper needs torch

    if not self.host_accessible:
        # A CUDA pool: torch views device memory through __cuda_array_interface__.
        if layer is None:
            raise ValueError("a CUDA pool is viewed one layer at a time")
        holder = type("_CudaView", (), {})()
        holder.__cuda_array_interface__ = self.cuda_array_interface(
            layer, -1 if plane is None else plane)
        # torch keeps the holder alive with the tensor; the holder keeps the pool (and so the
        # cache that owns the device memory), as every other view does.
        holder.pool = self
        # device="cuda" is what makes it a view: without a device torch returns a CPU copy of a
        # CUDA array interface object (pytorch/pytorch#54139); a pool on a GPU other than the
        # current one is refused by torch (RuntimeError), not copied.
        tensor = torch.as_tensor(holder, device="cuda")
        return tensor.view(torch.bfloat16) if self.geometry.dtype == KvDtype.BF16 else tensor
    if layer is None:
        if plane is not None:
            raise ValueError("plane needs a layer")
        array = self.array()
    elif plane is None:
        array = self.layer(layer)
    elif plane == 0:
        array = self.k(layer)
    elif plane == 1:
        array = self.v(layer)
    else:
        raise ValueError(f"plane must be 0 (K) or 1 (V), got {plane}")
    if self.geometry.dtype == KvDtype.BF16:
        # torch has no uint16: the bits go through int16 (same size, no copy) to bfloat16.
        return torch.from_numpy(array.view("int16")).view(torch.bfloat16)
    return torch.from_numpy(array)


HbmPool.tensor = _pool_tensor
