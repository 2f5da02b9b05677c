"""examples/python/agent_llama.py in ctest: a Llama-architecture decoder whose attention reads
K/V through kvtier's block tables from its HBM pool, serving multi-turn agent sessions whose
prefixes are evicted to DRAM and NVMe and restored; its logits must equal a dense recompute
within 1e-5 at every step, with identical greedy tokens. Skipped without torch."""
import importlib.util
import pathlib

import pytest

pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "agent_llama.py"


def test_agent_sessions_match_a_dense_recompute(capsys):
    spec = importlib.util.spec_from_file_location("agent_llama", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main() == 0
    out = capsys.readouterr().out
    assert "greedy tokens identical" in out and "agent_llama: OK" in out
