"""Telling a near-tie from a bug: `engine.exactness.classify` on crafted logits, on a
tiny model whose top-2 logits tie under a kernel that rounds by block size, and on a
target whose rollback keeps one token too many."""

import mlx.core as mx
import pytest
from lossless import long_prompt, plain, spec

from dflash_mlx import Target, load, load_draft, stream_generate
from dflash_mlx.engine import exactness
from dflash_mlx.engine.exactness import IDENTICAL, MISMATCH, NEAR_TIE, classify


def _logits(table: dict[int, float], size: int = 8, dtype=mx.float32):
    row = [-10.0] * size
    for token, value in table.items():
        row[token] = value
    return mx.array(row, dtype=dtype)


def test_identical_outputs():
    result = classify([1, 2, 3], [1, 2, 3], lambda prefix: _logits({}))
    assert result.verdict == IDENTICAL and result.ok and result.checked == 3
    assert "identical" in result.describe()


def test_a_tie_within_the_tolerance_then_plain_decoding_from_there():
    # position 1: tokens 2 and 5 one float32 ulp apart at the top
    ties = {1: _logits({2: 4.0, 5: 4.0 - 2**-21})}
    continued = []

    def plain_from(prefix, n):
        continued.append(list(prefix))
        return [6, 7][:n]  # plain decoding after DFlash's 5: what DFlash did too

    result = classify(
        [1, 2, 3, 4], [1, 5, 6, 7], lambda p: ties.get(len(p), _logits({})), plain_from
    )
    assert result.verdict == NEAR_TIE and result.ok and result.checked == 4
    (tie,) = result.differences
    assert (tie.index, tie.expected, tie.got) == (1, 2, 5)
    assert 0 < tie.gap <= tie.tolerance == 4.0 * 2**-12
    assert continued == [[1, 5]]
    assert "near-tie" in result.describe() and "gap" in result.describe()


def test_after_a_tie_a_later_difference_is_still_caught():
    logits = {1: _logits({2: 4.0, 5: 4.0}), 2: _logits({6: 9.0, 3: 1.0})}
    result = classify(
        [1, 2, 9, 9],
        [1, 5, 3, 4],
        lambda p: logits.get(len(p), _logits({})),
        lambda prefix, n: [6, 4][:n],  # plain goes on with 6, DFlash wrote 3
    )
    assert result.verdict == MISMATCH and not result.ok
    assert [d.index for d in result.differences] == [1, 2]
    assert result.differences[-1].gap == 8.0 and "MISMATCH" in result.describe()


@pytest.mark.parametrize(
    "dtype, second, verdict",
    [
        (mx.bfloat16, 20.0 - 0.25, NEAR_TIE),  # 2 bf16 ulps at 20: a tie
        (mx.bfloat16, 20.0 - 1.0, MISMATCH),
        (mx.float16, 20.0 - 0.02, NEAR_TIE),
        (mx.float32, 20.0 - 0.01, MISMATCH),  # float32 rounds far finer
    ],
)
def test_the_tolerance_follows_the_logits_dtype(dtype, second, verdict):
    logits = _logits({2: 20.0, 5: second}, dtype=dtype)
    assert classify([2], [5], lambda p: logits).verdict == verdict


def test_an_output_that_stops_early_or_runs_on_is_a_mismatch():
    for ref, out in (([1, 2, 3], [1, 2]), ([1, 2], [1, 2, 3])):
        result = classify(ref, out, lambda p: _logits({}))
        assert result.verdict == MISMATCH and result.differences[0].gap is None
        assert "stopped" in result.describe()


class BlockRounding(Target):
    """A kernel whose rounding depends on the rows computed together, as MLX's generic
    ones may: logits of a 2+ row block get `eps` more on one token."""

    def __init__(self, model, ids, token: int, eps: float):
        super().__init__(model, ids)
        self.bump = mx.zeros((self.vocab_size,)).at[token].add(eps)

    def logits(self, hidden):
        out = super().logits(hidden)
        return out + self.bump if hidden.ndim == 3 and hidden.shape[1] > 1 else out


class KeepsOneTooMany(Target):
    """A wrong rollback: after a partly rejected block it keeps one rejected token."""

    def rollback(self, cache, tape, processed, keep):
        super().rollback(cache, tape, processed, min(processed, keep + 1))


def _pair(tiny_pair, family):
    t, d = tiny_pair(family)
    model, tok = load(str(t))
    return model, tok, load_draft(str(d))


def test_a_near_tie_under_block_size_dependent_rounding(tiny_pair):
    model, tok, draft = _pair(tiny_pair, "qwen2")  # an untied head: rows can be copied
    prompt = long_prompt(model, tok, 24)
    ref = plain(model, tok, prompt, 24)
    a = max(set(ref[1:]), key=ref.count)  # a token plain decoding picks, mid-answer
    b = a + 1  # its twin: plain decoding's argmax keeps the first of equal logits
    head = model.lm_head.weight
    model.lm_head.weight = mx.concatenate([head[:b], head[a : a + 1], head[b + 1 :]])
    ref = plain(model, tok, prompt, 24)
    target = BlockRounding(model, draft.args.target_layer_ids, b, 1e-4)
    out, _ = spec(target, draft, tok, prompt, max_tokens=24, block_size=4)
    assert out != ref and b in out and b not in ref  # the bump broke the ties
    result = classify(ref, out, *exactness.referee(model, tok, prompt))
    assert result.verdict == NEAR_TIE, result.describe()
    assert all(d.got == b and abs(d.gap) <= d.tolerance for d in result.differences)


def test_a_wrong_rollback_is_a_mismatch(tiny_pair):
    model, tok, draft = _pair(tiny_pair, "llama")
    prompt = long_prompt(model, tok, 24)
    ref = plain(model, tok, prompt, 24)
    target = KeepsOneTooMany(model, draft.args.target_layer_ids)
    out, responses = spec(target, draft, tok, prompt, max_tokens=24, block_size=8)
    assert out != ref
    result = classify(ref, out, *exactness.referee(model, tok, prompt))
    assert result.verdict == MISMATCH, result.describe()
    wrong = result.differences[-1]
    assert wrong.gap is None or wrong.gap > wrong.tolerance


def test_an_exact_engine_is_identical(tiny_pair):
    model, tok, draft = _pair(tiny_pair, "qwen3_5")
    prompt = long_prompt(model, tok, 24)
    ref = plain(model, tok, prompt, 24)
    out, _ = spec(model, draft, tok, prompt, max_tokens=24, block_size=8)
    result = classify(ref, out, *exactness.referee(model, tok, prompt))
    assert result.verdict == IDENTICAL and result.checked == 24


def _twin_head_target(tiny_pair, models_dir, prompt_text: str):
    """A tiny qwen2 target on disk whose head has two identical rows (a, b = a + 1),
    a being a token plain decoding picks mid-answer for `prompt_text`'s chat prompt."""
    from mlx.utils import tree_flatten

    from dflash_mlx.bench import chat_ids

    t, d = tiny_pair("qwen2")
    model, tok = load(str(t))
    ids = chat_ids(tok, [{"role": "user", "content": prompt_text}], False)
    ref = plain(model, tok, ids, 24)
    a = max(set(ref[1:]), key=ref.count)
    twin = models_dir / f"qwen2-twin-{a}"
    if not twin.exists():
        import shutil

        shutil.copytree(t, twin)
        head = model.lm_head.weight
        b = a + 1
        model.lm_head.weight = mx.concatenate([head[:b], head[a:b], head[b + 1 :]])
        weights = dict(tree_flatten(model.parameters()))
        mx.save_safetensors(str(twin / "model.safetensors"), weights)
    return twin, d, a + 1


def _engine(target, draft, tok):
    def run(ids, max_tokens, block_size):
        for r in stream_generate(
            target, draft, tok, ids, block_size=block_size, max_tokens=max_tokens
        ):
            yield r.tokens, r.accepted

    return run


def test_bench_reports_near_ties_and_mismatches(tiny_pair, models_dir):
    """Bench's lossless check: a near-tie is not a failure, a wrong rollback is; the
    JSON report carries each verdict with its gap."""
    import json

    from mlx_lm.sample_utils import make_sampler

    from dflash_mlx import bench
    from dflash_mlx.datasets import Sample

    text = "Once upon a time"
    twin, d, b = _twin_head_target(tiny_pair, models_dir, text)
    model, tok = load(str(twin))
    draft = load_draft(str(d))
    ids = draft.args.target_layer_ids
    engines = {
        bench.BASELINE: bench.mlx_lm_engine(model, tok, make_sampler(0.0)),
        "ties": _engine(BlockRounding(model, ids, b, 1e-4), draft, tok),
        "wrong": _engine(KeepsOneTooMany(model, ids), draft, tok),
    }
    config = bench.BenchConfig(["custom"], [4], max_tokens=24, warmup_tokens=2)
    samples = {"custom": [Sample("custom", "0", (text,))]}
    (records,) = bench.run(
        tok, engines, samples, config, lambda p: exactness.referee(model, tok, p)
    )
    verdicts = {r.engine: r.exactness["verdict"] for r in records[1:]}
    assert verdicts == {"ties": NEAR_TIE, "wrong": MISMATCH}
    ties = next(r for r in records if r.engine == "ties")
    assert ties.lossless and ties.first_mismatch is not None
    assert all(abs(d["gap"]) <= d["tolerance"] for d in ties.exactness["differences"])
    summary = bench.summarize(records)
    assert not summary["lossless"] and len(summary["failures"]) == 1
    assert [t["engine"] for t in summary["near_ties"]] == ["ties"]
    assert {r["engine"]: r["near_ties"] for r in summary["rows"]} == {
        "ties": 1,
        "wrong": 0,
    }
    report = json.loads(json.dumps(bench.report(config, {}, records, summary)))
    assert report["records"][1]["exactness"]["verdict"] in (NEAR_TIE, MISMATCH)
    assert bench.compact(summary)["near_ties"] == 1


def test_generate_check(tiny_pair, kernels_args):
    """`generate --check`: the verdict in --json and on stderr; greedy only."""
    import json

    from typer.testing import CliRunner

    from dflash_mlx.cli.main import app

    t, d = tiny_pair("qwen3")
    args = [*kernels_args, "generate", "-m", str(t), "-d", str(d), "-p", "hello"]
    result = CliRunner().invoke(app, [*args, "-n", "12", "--check", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["exactness"] == {
        "verdict": IDENTICAL,
        "checked": len(record["tokens"]),
        "differences": [],
    }
    assert "check: identical to plain decoding" in result.stderr
    result = CliRunner().invoke(app, [*args, "--check", "--temp", "0.7"])
    assert result.exit_code == 2 and "--check compares greedy" in result.output
