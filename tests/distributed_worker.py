"""One rank of tests/test_distributed.py, started by `mlx.launch`: runs the scenarios in
the spec file on a sharded tiny target and writes this rank's results as JSON."""

import contextlib
import json
import os
import sys
from pathlib import Path

import mlx.core as mx
import mlx_lm
from mlx_lm.generate import generation_stream

sys.path.insert(0, str(Path(__file__).parent))

from lossless import oracle  # noqa: E402

from dflash_mlx import (  # noqa: E402
    backend,
    distributed,
    load,
    load_draft,
    stream_generate,
)
from dflash_mlx.engine.loop import as_target  # noqa: E402


def barrier():
    # on generation's stream: after any collective a generation left in flight
    mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=generation_stream))


def _tokens(responses) -> list[int]:
    return [t for r in responses for t in r.tokens]


def main(spec_file: str):
    spec = json.loads(Path(spec_file).read_text())
    kernels = backend.named(spec.get("kernels", "device"))  # the test run's --kernels
    with backend.forced(kernels) if kernels else contextlib.nullcontext():
        run_cases(spec)


def run_cases(spec: dict):
    results = {}
    for case in spec["cases"]:
        try:
            results[case["name"]] = run_case(case)
        except ValueError as e:  # the error cases: every rank reports its message
            results[case["name"]] = {"error": str(e)}
        barrier()
    rank = mx.distributed.init().rank()
    if spec.get("die_rank") == rank:  # as a crash does: no interpreter shutdown, which
        sys.stdout.flush()  # a peer's own error on the closed ring could outrun
        os._exit(3)
    barrier()
    Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(results))


def run_case(case: dict) -> dict:
    group = distributed.launched(case["sharding"])
    assert group is not None, "not launched with 2+ ranks"
    model, tok = load(case["target"], distributed=group)
    draft_path = case.get("draft_per_rank", {}).get(str(group.rank), case["draft"])
    draft = load_draft(draft_path, target=model, distributed=group)
    prompt, n = case["prompt"], case["max_tokens"]
    out = {"group": group.describe()}
    ref = [r.token for r in mlx_lm.stream_generate(model, tok, prompt, max_tokens=n)]
    out["plain"] = ref
    drafters = {
        "random": draft,
        "full": oracle(draft, prompt + ref),
        "partial": oracle(draft, prompt + ref, lambda k, i: i % 4 == 0),
        "none": oracle(draft, prompt + ref, lambda k, i: True),
    }
    for name, b in case["runs"]:  # (drafter, block size) pairs
        responses = list(
            stream_generate(
                model, drafters[name], tok, prompt, max_tokens=n, block_size=b
            )
        )
        out[f"greedy/{name}/{b}"] = _tokens(responses)
        out[f"accepted/{name}/{b}"] = max(r.accepted or 0 for r in responses)
    # every id occurs in this prompt, so every history's last id has a continuation
    # to copy: lookup proposes on every block, whatever the tiny target generates
    every_id = list(range(as_target(model, draft).vocab_size))
    out.update(_lookup_runs(model, draft, tok, prompt * 3 + every_id, n))
    for seed in (None, 3):
        responses = stream_generate(
            model, draft, tok, prompt, max_tokens=n, block_size="auto",
            temperature=1.0, top_p=0.9, seed=seed,
        )  # fmt: skip
        out[f"sampled/{seed}"] = _tokens(responses)
    if case.get("chi2_runs"):
        out["chi2"] = [
            _tokens(
                stream_generate(
                    model,
                    drafters["partial"],
                    tok,
                    prompt,
                    max_tokens=3,
                    block_size=3,
                    temperature=1.0,
                    top_k=3,
                    seed=i,
                )
            )  # fmt: skip
            for i in range(case["chi2_runs"])
        ]
        out["chi2_probs"] = _first_three_probs(model, prompt)
    return out


def _lookup_runs(model, draft, tok, prompt, n) -> dict:
    """Prompt lookup on a prompt that repeats: greedy tokens and each block's (source,
    verified, taken) under a fixed size (copies fill the block) and "auto" (rank 0's
    plans broadcast); seeded sampling with and without lookup."""
    plain = mlx_lm.stream_generate(model, tok, prompt, max_tokens=n)
    out = {"lookup/plain": [r.token for r in plain]}
    for b in (8, "auto"):
        responses = list(
            stream_generate(
                model, draft, tok, prompt, max_tokens=n, block_size=b, lookup=True
            )
        )
        out[f"lookup/greedy/{b}"] = _tokens(responses)
        out[f"lookup/blocks/{b}"] = [
            [r.source, r.block_size, r.from_draft] for r in responses
        ]
    for lookup in (False, True):
        out[f"lookup/seeded/{lookup}"] = _tokens(stream_generate(
            model, draft, tok, prompt, max_tokens=n, block_size="auto",
            temperature=1.0, top_p=0.9, seed=3, lookup=lookup,
        ))  # fmt: skip
    return out


def _first_three_probs(model, prompt):
    """The sharded target's exact top-3 sampling distribution over 3 tokens."""
    from dflash_mlx import SamplingParams

    params = SamplingParams(temperature=1.0, top_k=3)

    def probs(prefix):
        return params.probs(model(mx.array([prefix]))[0, -1]).tolist()

    exact = {}
    p1 = probs(prompt)
    for a in [i for i, p in enumerate(p1) if p > 0]:
        p2 = probs(prompt + [a])
        for b in [i for i, p in enumerate(p2) if p > 0]:
            p3 = probs(prompt + [a, b])
            for c in [i for i, p in enumerate(p3) if p > 0]:
                exact[f"{a},{b},{c}"] = p1[a] * p2[b] * p3[c]
    return exact


if __name__ == "__main__":
    main(sys.argv[1])
