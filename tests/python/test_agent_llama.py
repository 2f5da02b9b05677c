"""examples/python/agent_llama.py in ctest: a Llama-architecture decoder whose attention reads
K/V through kvtier's block tables from its HBM pool, serving multi-turn agent sessions whose
prefixes are evicted to DRAM and NVMe and restored; its logits must equal a dense recompute
within 1e-5 at every step, with identical greedy tokens. Skipped without torch."""
import importlib.util
import pathlib

import pytest

pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "agent_llama.py"


def load_example():
    spec = importlib.util.spec_from_file_location("agent_llama", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


@pytest.mark.parametrize("layout", ["LAYER_KV_SPLIT", "LAYER_FIRST"])
def test_agent_sessions_match_a_dense_recompute(layout):
    import kvtier
    example = load_example()
    # LAYER_KV_SPLIT: the model's own tensors (vLLM's FlashAttention layout) are kvtier's pool;
    # LAYER_FIRST: the model reads kvtier's pool views. Both run layer by layer on ASYNC tickets.
    # serve() asserts logits within 1e-5 and identical greedy tokens at every step.
    r = example.serve(layout=getattr(kvtier.HbmLayout, layout))
    assert r["steps"] == 4 * 2 * 7  # sessions x turns x (prefill + 6 decode steps)
    assert r["layer_waits"] == r["steps"] * example.LAYERS  # every layer waited for its own
    assert r["early_layers"] <= r["layer_waits"]
    assert r["max_error"] <= 1e-5
    # Turn 1's prefixes left HBM for DRAM and NVMe, and turn 2 restored them from there.
    assert r["hbm_to_dram"] > 0 and r["dram_to_nvme"] > 0
    assert r["restored_blocks"] > 0 and r["hits"][1] + r["hits"][2] > 0
