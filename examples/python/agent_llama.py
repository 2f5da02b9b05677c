"""A small Llama-architecture decoder served from kvtier's blocks.

Four layers, GQA with 8 query and 2 KV heads of size 64, RoPE, RMSNorm and SwiGLU, random fp32
weights from a fixed seed. Its attention reads K and V only through the ticket's block table
from kvtier's HBM pool (paged attention in torch: gather the sequence's slots, attend), and
writes each new token's K/V into the slot the table gives. Several agent sessions run two turns
each against a small HBM: turn 1 prefills a prompt and decodes, then the agent waits on a tool
(Pause: its blocks get a copy in DRAM); the other sessions' turns evict it from HBM (and DRAM
evicts down to NVMe); turn 2 is a new request whose prompt extends turn 1's context, attaches
that prefix and restores it from the lower tiers. At every step the logits are compared with a
dense recompute of the whole context without any cache, and the greedy tokens with its tokens.

kvtier has no fp32 KV dtype, so the cache's geometry says fp16 with head_dim 128: each fp32
element occupies two fp16 slots, and the pool is viewed as float32 ([slots][B][heads][64]). The
cache moves blocks as opaque bytes, so the KV round-trips exactly.

The KV lives where an engine keeps it: by default the model owns one tensor per layer in vLLM's
FlashAttention layout ([2][num_blocks][B][KV_HEADS][HEAD_DIM], HbmLayout.LAYER_KV_SPLIT) and
registers them as kvtier's HBM pool (TierStack hbm_tensors), so kvtier onboards into the
model's own tensors; with layout=LAYER_FIRST it reads kvtier's pool views instead.

Each forward pass takes an ASYNC ticket and runs layer by layer as the ticket reports
readiness: the attention of layer l waits only for layer l of the restored blocks
(ResidencyTicket.layer_ready(l)), while later layers may still be in transfer.

Run: PYTHONPATH=build/default/python /usr/bin/python3 examples/python/agent_llama.py
Exit code 0 when every step matches.
"""
import sys
import tempfile

import numpy as np
import torch

import kvtier

VOCAB, HIDDEN, LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM, FFN = 512, 512, 4, 8, 2, 64, 1024
B = 16  # tokens per block
TOLERANCE = 1e-5


class Model:
    """Random weights from a fixed seed; forward() over any KV store (paged or dense)."""

    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)

        def w(*shape):
            return torch.randn(*shape, generator=g, dtype=torch.float32) / shape[0] ** 0.5

        self.embed = torch.randn(VOCAB, HIDDEN, generator=g)
        self.layers = [dict(wq=w(HIDDEN, Q_HEADS * HEAD_DIM), wk=w(HIDDEN, KV_HEADS * HEAD_DIM),
                            wv=w(HIDDEN, KV_HEADS * HEAD_DIM), wo=w(Q_HEADS * HEAD_DIM, HIDDEN),
                            w1=w(HIDDEN, FFN), w3=w(HIDDEN, FFN), w2=w(FFN, HIDDEN),
                            n1=1 + 0.1 * torch.randn(HIDDEN, generator=g),
                            n2=1 + 0.1 * torch.randn(HIDDEN, generator=g))
                       for _ in range(LAYERS)]
        self.norm = 1 + 0.1 * torch.randn(HIDDEN, generator=g)
        self.head = w(HIDDEN, VOCAB)
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))

    @staticmethod
    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    def rope(self, x, positions):  # x [T][heads][HEAD_DIM]
        angles = positions[:, None].float() * self.inv_freq[None, :]
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(self, tokens, start, store):
        """Logits [T][VOCAB] of tokens at positions start.. (their K/V go into `store`, which
        holds positions [0, start) already)."""
        positions = torch.arange(start, start + len(tokens))
        h = self.embed[torch.as_tensor(tokens, dtype=torch.long)]
        n = start + len(tokens)
        for l, p in enumerate(self.layers):
            x = self.rms(h, p["n1"])
            q = self.rope((x @ p["wq"]).view(-1, Q_HEADS, HEAD_DIM), positions)
            k = self.rope((x @ p["wk"]).view(-1, KV_HEADS, HEAD_DIM), positions)
            v = (x @ p["wv"]).view(-1, KV_HEADS, HEAD_DIM)
            store.write(l, start, k, v)
            store.ready(l)  # layer l of every block this pass reads is in place
            keys, values = store.read(l, n)  # [n][KV_HEADS][HEAD_DIM]
            group = Q_HEADS // KV_HEADS
            keys = keys.repeat_interleave(group, dim=1)
            values = values.repeat_interleave(group, dim=1)
            scores = torch.einsum("thd,nhd->htn", q, keys) / HEAD_DIM ** 0.5
            causal = torch.arange(n)[None, :] > positions[:, None]  # [T][n]
            scores = scores.masked_fill(causal[None], float("-inf"))
            out = torch.einsum("htn,nhd->thd", scores.softmax(-1), values)
            h = h + out.reshape(len(tokens), -1) @ p["wo"]
            x = self.rms(h, p["n2"])
            h = h + (torch.nn.functional.silu(x @ p["w1"]) * (x @ p["w3"])) @ p["w2"]
        return self.rms(h, self.norm) @ self.head


class DenseStore:
    """The reference: every position's K/V in plain tensors, recomputed from scratch."""

    def __init__(self):
        self.k = [torch.empty(0, KV_HEADS, HEAD_DIM) for _ in range(LAYERS)]
        self.v = [torch.empty(0, KV_HEADS, HEAD_DIM) for _ in range(LAYERS)]

    def ready(self, l):
        pass

    def write(self, l, start, k, v):
        assert self.k[l].shape[0] == start
        self.k[l] = torch.cat([self.k[l], k])
        self.v[l] = torch.cat([self.v[l], v])

    def read(self, l, n):
        return self.k[l][:n], self.v[l][:n]


class PagedStore:
    """K/V in the HBM pool (kvtier's views of it, or the model's own tensors registered as it),
    addressed only through an ASYNC ticket's block table, layer by layer as it lands."""

    def __init__(self, k, v, ticket, stats):
        self.k, self.v, self.ticket, self.stats = k, v, ticket, stats
        self.table = None

    def ready(self, l):
        """Waits for layer l of the ticket's blocks; the table is final for them from then."""
        if not self.ticket.completion.done:
            self.stats["early_layers"] += 1  # layer l runs while the ticket is still in transfer
        self.ticket.layer_ready(l).wait(30.0)
        self.stats["layer_waits"] += 1
        if self.table is None:
            self.table = torch.as_tensor(self.ticket.block_table, dtype=torch.long)
            assert (self.table >= 0).all(), "a block is not resident"

    def write(self, l, start, k, v):
        # The new tokens' blocks were resident (freshly appended) when the ticket was issued:
        # their slots are in the table at once.
        table = torch.as_tensor(self.ticket.block_table, dtype=torch.long)
        positions = torch.arange(start, start + k.shape[0])
        slots, offsets = table[positions // B], positions % B
        assert (slots >= 0).all()
        self.k[l][slots, offsets] = k
        self.v[l][slots, offsets] = v

    def read(self, l, n):
        blocks = (n + B - 1) // B
        k = self.k[l][self.table[:blocks]].reshape(blocks * B, KV_HEADS, HEAD_DIM)[:n]
        v = self.v[l][self.table[:blocks]].reshape(blocks * B, KV_HEADS, HEAD_DIM)[:n]
        return k, v


class Server:
    def __init__(self, model, cache, engine_kv=None):
        """engine_kv: the model's own per-layer tensors registered as the pool
        ([2][slots][B][KV_HEADS][2 * HEAD_DIM] fp16 each); None: kvtier's pool views."""
        self.model, self.cache = model, cache
        if engine_kv is not None:  # fp32 over fp16 pairs: [slots][B][KV_HEADS][HEAD_DIM]
            self.k = [t[0].view(torch.float32) for t in engine_kv]
            self.v = [t[1].view(torch.float32) for t in engine_kv]
        else:
            pool = cache.hbm_pool
            self.k = [torch.from_numpy(pool.k(l).view(np.float32)) for l in range(LAYERS)]
            self.v = [torch.from_numpy(pool.v(l).view(np.float32)) for l in range(LAYERS)]
        self.max_error = 0.0
        self.steps = 0
        self.layer_stats = dict(layer_waits=0, early_layers=0)

    def check(self, logits, context):
        """The last position's logits against a dense recompute of the whole context."""
        dense = self.model.forward(context, 0, DenseStore())[-1]
        error = (logits - dense).abs().max().item()
        self.max_error = max(self.max_error, error)
        self.steps += 1
        assert error <= TOLERANCE, f"step {self.steps}: logits differ by {error}"
        assert int(logits.argmax()) == int(dense.argmax()), f"step {self.steps}: tokens differ"

    def forward(self, seq, tokens, start):
        """One forward pass of tokens at start.. through the cache; the last logits."""
        end = start + len(tokens)
        with self.cache.ensure_resident(seq, 0, end, mode=kvtier.ResidencyMode.ASYNC) as ticket:
            store = PagedStore(self.k, self.v, ticket, self.layer_stats)
            logits = self.model.forward(tokens, start, store)
            ticket.completion.wait(30.0)
            self.cache.report_written(seq, end)
        return logits[-1]

    def turn(self, seq, session, context, decode):
        """One request: attach, prefill the rest, decode greedily. The sequence's tokens."""
        self.cache.create_sequence(seq, session=session)
        hit = self.cache.attach_prefix(seq, context)
        start = hit.attached_tokens
        self.cache.append(seq, context[start:])
        tokens = list(context)
        logits = self.forward(seq, tokens[start:], start)
        self.check(logits, tokens)
        for _ in range(decode):
            token = int(logits.argmax())
            tokens.append(token)
            self.cache.append(seq, [token])
            logits = self.forward(seq, [token], len(tokens) - 1)
            self.check(logits, tokens)
        return tokens, hit


def serve(sessions=4, decode=6, layout=kvtier.HbmLayout.LAYER_KV_SPLIT):
    """Runs every session's two turns; a summary of what happened (asserting every step).
    LAYER_KV_SPLIT: the model's own tensors are the pool; LAYER_FIRST: kvtier's pool views."""
    torch.set_num_threads(2)
    model = Model(seed=0)
    g = kvtier.KvGeometry(num_layers=LAYERS, num_kv_heads=KV_HEADS, head_dim=2 * HEAD_DIM,
                          dtype=kvtier.KvDtype.FP16, tokens_per_block=B)
    ns = kvtier.CacheNamespace(g, model_id="tiny-llama-fp32-as-fp16x2", weights_fingerprint="seed0",
                               hbm_layout=layout)
    rng = np.random.default_rng(0)
    hbm_blocks = 10
    engine_kv = None
    if layout == kvtier.HbmLayout.LAYER_KV_SPLIT:
        engine_kv = [torch.zeros(2, hbm_blocks, B, KV_HEADS, 2 * HEAD_DIM, dtype=torch.float16)
                     for _ in range(LAYERS)]
    with tempfile.TemporaryDirectory() as tmp:
        stack = kvtier.TierStack(ns, hbm_blocks=hbm_blocks, dram_blocks=8, nvme_blocks=64,
                                 nvme_path=f"{tmp}/kv.nvme", hbm_tensors=engine_kv or [])
        cache = kvtier.KvCache.create(ns, stack)
        server = Server(model, cache, engine_kv)
        turn1 = {}
        for s in range(sessions):  # turn 1 of every session; each then waits on a tool
            prompt = rng.integers(0, VOCAB, 40).tolist()
            turn1[s], _ = server.turn(100 + s, s + 1, prompt, decode)
            cache.pause(100 + s, expected_idle_s=5.0)
        for s in range(sessions):  # the tools return: turn 1's requests end
            cache.release(100 + s, stop_reason=kvtier.StopReason.TOOL_USE)
        restored = 0
        for s in range(sessions):  # turn 2: the context so far plus the tool's result
            context = turn1[s] + rng.integers(0, VOCAB, 12).tolist()
            _, hit = server.turn(200 + s, s + 1, context, decode)
            restored += sum(hit.attached_blocks_by_tier[1:])
            cache.release(200 + s, stop_reason=kvtier.StopReason.END_TURN)
        cache.check_invariants()
        stats = cache.stats()
    return dict(steps=server.steps, max_error=server.max_error, restored_blocks=restored,
                layer_waits=server.layer_stats["layer_waits"],
                early_layers=server.layer_stats["early_layers"],
                hits=[stats.tiers[t].hits for t in range(3)],
                hbm_to_dram=stats.moved(kvtier.Tier.HBM, kvtier.Tier.DRAM),
                dram_to_nvme=stats.moved(kvtier.Tier.DRAM, kvtier.Tier.NVME))


def main():
    r = serve()
    hits = r["hits"]
    print(f"{r['steps']} steps, max |logits - dense| = {r['max_error']:.2e}, "
          f"greedy tokens identical; attached blocks restored from below HBM: "
          f"{r['restored_blocks']}; hits hbm/dram/nvme = {hits[0]}/{hits[1]}/{hits[2]}; "
          f"demotions hbm->dram {r['hbm_to_dram']}, dram->nvme {r['dram_to_nvme']}; "
          f"layer waits {r['layer_waits']}, layers run before their ticket completed "
          f"{r['early_layers']}")
    ok = r["restored_blocks"] > 0 and hits[1] + hits[2] > 0
    print("agent_llama: OK" if ok else "agent_llama: nothing was restored from a lower tier")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
