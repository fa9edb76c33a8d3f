"""Two local ranks on the ring backend (mlx.launch): sharded targets stay lossless."""

import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import launcher
import pytest
import tiny
from chisquare import chi2, chi2_critical
from lossless import plain

from dflash_mlx import load

pytestmark = [launcher.needs_two_ranks, pytest.mark.slow]  # make test-all
PROMPT = [5, 17, 99, 3, 42]
BLOCK_SIZES = [1, 4, 8, 16, "auto"]
# drafters that accept partly (every block size), fully, not at all, and a random one
RUNS = [("partial", b) for b in BLOCK_SIZES]
RUNS += [("full", 16), ("full", "auto"), ("none", 8), ("random", "auto")]
TENSOR = [
    "llama", "qwen3", "qwen3_5", "qwen3_moe", "gpt_oss", "deepseek_v3", "minimax",
    "glm_moe_dsa",
]  # fmt: skip
PIPELINE = ["qwen3_5", "qwen3_next", "deepseek_v3"]


def _case(root: Path, name: str, family: str, sharding: str, **kw) -> dict:
    target = root / f"{name}-target"
    if not target.exists():
        tiny.make_target(target, family, **kw.pop("target", {}))
    draft = tiny.make_draft(root / f"{name}-draft", target, block_size=16)  # b16 runs
    return dict(
        name=name, target=str(target), draft=str(draft), sharding=sharding,
        prompt=PROMPT, max_tokens=16, runs=RUNS, **kw,
    )  # fmt: skip


def launch(tmp: Path, cases: list, **spec) -> subprocess.CompletedProcess:
    spec = {"cases": cases, "out": str(tmp), **spec}
    (tmp / "spec.json").write_text(json.dumps(spec))
    worker = Path(__file__).with_name("distributed_worker.py")
    return launcher.run(sys.executable, str(worker), str(tmp / "spec.json"))


def _needed(request, cases: list) -> list:
    """On the generic kernels (--kernels=mlx), only the cases the selected tests read:
    a launch runs every case it is given."""
    if request.config.getoption("kernels") == "device":
        return cases
    names = {
        item.callspec.params.get("name")
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    return [c for c in cases if c["name"] in names]


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    cases = [_case(root, f"{f}-tensor", f, "tensor") for f in TENSOR]
    cases += [_case(root, f"{f}-pipeline", f, "pipeline") for f in PIPELINE]
    cases[1]["chi2_runs"] = 600  # qwen3, tensor parallel
    other = tiny.make_draft(root / "other-draft", Path(cases[0]["target"]), seed=9)
    cases += [
        _case(root, "gemma-tensor", "gemma4_text", "tensor"),
        _case(root, "odd-heads", "llama", "tensor",
              target=dict(num_attention_heads=3, num_key_value_heads=1,
                          hidden_size=48)),
        {**cases[0], "name": "odd-drafter", "draft_per_rank": {"1": str(other)}},
    ]  # fmt: skip
    cases = _needed(request, cases)
    proc = launch(root, cases, kernels=request.config.getoption("kernels"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [json.loads((root / f"rank{r}.json").read_text()) for r in (0, 1)]
    return {c["name"]: (c, ranks[0][c["name"]], ranks[1][c["name"]]) for c in cases}


@pytest.mark.parametrize(
    "name", [f"{f}-tensor" for f in TENSOR] + [f"{f}-pipeline" for f in PIPELINE]
)
def test_greedy_on_two_ranks_equals_plain_decoding(runs, name):
    case, rank0, rank1 = runs[name]
    assert rank0 == {k: v for k, v in rank1.items()}  # the ranks never diverge
    assert rank0["group"] == {
        "backend": "ring",
        "size": 2,
        "sharding": case["sharding"],
    }
    ref = rank0["plain"]  # mlx-lm decoding the same sharded target
    for drafter, b in RUNS:
        assert rank0[f"greedy/{drafter}/{b}"] == ref, (drafter, b)
    assert (
        rank0["accepted/full/16"] == 15 and rank0["accepted/none/8"] == 1
    )  # 16 tokens: the prefill one, then 15 in a block
    model, tok = load(case["target"])  # and, on these tiny models, one process's
    assert plain(model, tok, PROMPT, 16) == ref


@pytest.mark.parametrize(
    "name", [f"{f}-tensor" for f in TENSOR] + [f"{f}-pipeline" for f in PIPELINE]
)
def test_lookup_on_two_ranks_proposes_alike_and_stays_lossless(runs, name):
    """Prompt lookup on a prompt holding every id: every rank verifies the same
    copies (same sources, sizes and accepted counts, block by block), greedy output
    is plain decoding's, and seeded sampling gives the same tokens with and without
    lookup."""
    _, rank0, rank1 = runs[name]
    for b in (8, "auto"):
        assert rank0[f"lookup/greedy/{b}"] == rank0["lookup/plain"], b
        assert rank0[f"lookup/blocks/{b}"] == rank1[f"lookup/blocks/{b}"], b
    assert any(block[0] == "lookup" for block in rank0["lookup/blocks/8"])
    seeded = rank0["lookup/seeded/True"]
    assert seeded == rank0["lookup/seeded/False"] == rank1["lookup/seeded/True"]


def test_sampling_agrees_across_ranks(runs):
    for name in [f"{f}-tensor" for f in TENSOR]:
        _, rank0, rank1 = runs[name]
        assert rank0["sampled/None"] == rank1["sampled/None"]  # shared seed
        assert rank0["sampled/3"] == rank1["sampled/3"]


def test_sampling_on_two_ranks_has_the_sharded_targets_distribution(runs):
    _, rank0, _ = runs["qwen3-tensor"]
    exact = rank0["chi2_probs"]
    counts = Counter(",".join(map(str, seq)) for seq in rank0["chi2"])
    outcomes = list(exact)
    assert set(counts) <= set(outcomes)
    stat, dof = chi2([counts[o] for o in outcomes], [exact[o] for o in outcomes])
    assert stat < chi2_critical(dof), stat


def test_error_cases_name_the_fix(runs):
    for name, words in [
        ("gemma-tensor", "cannot shard 'gemma4_text' targets tensor-parallel"),
        ("odd-heads", "not divisible by 2 ranks"),
        ("odd-drafter", "Ranks [1] have a different drafter than rank 0"),
    ]:
        _, rank0, rank1 = runs[name]
        assert words in rank0["error"] and rank0 == rank1, (name, rank0)


def test_a_rank_that_dies_stops_the_others(tmp_path, runs):
    case = runs["llama-tensor"][0]
    start = time.monotonic()
    proc = launch(tmp_path, [{**case, "runs": [("partial", 4)]}], die_rank=1)
    said = proc.stdout + proc.stderr  # mlx.launch names the rank and stops the rest
    assert "rank 1 exited with code 3" in said
    # Rank 0 stops either way: killed by mlx.launch (-15), or first, by its own
    # error when the ring socket to the dead rank closes (1). Which comes first
    # is a race.
    rank0 = re.search(r"rank 0 exited with code (-?\d+)", said)
    assert rank0 and rank0.group(1) in ("-15", "1"), said
    assert time.monotonic() - start < 300 and not (tmp_path / "rank0.json").exists()
