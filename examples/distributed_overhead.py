"""How speculation amortises the collectives of a sharded target: 1 process vs 2 ranks.

    python examples/distributed_overhead.py [--hidden 512] [--layers 8] [--tokens 128]

Builds a random qwen3 target and a drafter whose proposals are the target's own greedy
continuation except every 4th position (so the acceptance is known and the same in
both settings), then measures plain decoding and DFlash (fixed block 8) on one process,
and again on two local ranks (`mlx.launch -n 2 --backend ring`, tensor parallel). A
tensor-parallel forward pays one all-reduce per sharded output projection; a verified
block pays them once for all its tokens. Prints the table and the cost model, then one
line of JSON. Run it on an idle machine; the numbers name the CPU they came from.
"""

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))

from random_pair import make_pair  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog. " * 2


def _oracle(draft, reference: list[int]):
    """`draft`, proposing `reference` (the target's greedy tokens) but every 4th one."""
    base = type(draft)

    class Oracle(base):
        def __call__(self, block, cache):
            self._pos, self._len = cache[0].offset, block.shape[1]
            return super().__call__(block, cache)

        def finalize_logits(self, logits):
            rows = []
            for k in range(1, self._len):
                i = self._pos + k
                tok = reference[i] if i < len(reference) else 0
                rows.append(tok + 1 if i % 4 == 0 else tok)
            return mx.eye(logits.shape[-1])[mx.array(rows)] * 100.0

    oracle = Oracle(draft.args)
    oracle.update(draft.parameters())
    oracle.use_kernels(draft.kernels)
    return oracle


def _sharded_collectives(model) -> int:
    """All-reduces in one forward: one per sharded-to-all projection."""
    from mlx.nn.layers.distributed import (
        QuantizedShardedToAllLinear,
        ShardedToAllLinear,
    )

    kinds = (ShardedToAllLinear, QuantizedShardedToAllLinear)
    return sum(isinstance(m, kinds) for _, m in model.named_modules())


def _decode_tps(model, draft, tok, ids, n, block_size) -> tuple[float, float]:
    from dflash_mlx import stream_generate

    blocks, start, tokens = 0, None, 0
    for r in stream_generate(
        model, draft, tok, ids, max_tokens=n, block_size=block_size
    ):
        if start is None:
            start = time.perf_counter()  # after the prefill's token
            continue
        blocks += 1
        tokens += len(r.tokens)
    return tokens / (time.perf_counter() - start), tokens / max(blocks, 1)


def _all_sum_seconds(group, rows: int, hidden: int, repeats: int = 200) -> float:
    from mlx_lm.generate import generation_stream

    x = mx.ones((1, rows, hidden))
    mx.eval(mx.distributed.all_sum(x, group=group, stream=generation_stream))
    start = time.perf_counter()
    for _ in range(repeats):
        mx.eval(mx.distributed.all_sum(x, group=group, stream=generation_stream))
    return (time.perf_counter() - start) / repeats


def measure(target: str, draft_dir: str, tokens: int, distributed: bool) -> dict:
    import mlx_lm

    from dflash_mlx import distributed as dist
    from dflash_mlx import load, load_draft

    group = dist.launched() if distributed else None
    model, tok = load(target, distributed=group)
    draft = load_draft(draft_dir, target=model, distributed=group)
    ids = tok.encode(PROMPT)
    reference = ids + [
        r.token for r in mlx_lm.stream_generate(model, tok, ids, max_tokens=tokens + 16)
    ]
    oracle = _oracle(draft, reference)
    _decode_tps(model, oracle, tok, ids, 16, 8)  # warm-up: kernels for every shape
    plain, _ = _decode_tps(model, None, tok, ids, tokens, 1)
    spec, tau = _decode_tps(model, oracle, tok, ids, tokens, 8)
    out = {"plain_tps": plain, "dflash_tps": spec, "tau": tau, "speedup": spec / plain}
    if group is not None:
        hidden = model.args.hidden_size
        per_forward = _sharded_collectives(model)
        out.update(
            collectives_per_forward=per_forward,
            bytes_per_token=per_forward * hidden * 4,
            all_sum_1_s=_all_sum_seconds(group.group, 1, hidden),
            all_sum_8_s=_all_sum_seconds(group.group, 8, hidden),
            rank=group.rank,
        )
    return out


def _worker(spec: str):
    args = json.loads(Path(spec).read_text())
    result = measure(args["target"], args["draft"], args["tokens"], distributed=True)
    if result["rank"] == 0:
        Path(args["out"]).write_text(json.dumps(result))


def _two_ranks(target, draft, tokens, root: Path) -> dict:
    spec, out = root / "spec.json", root / "ranks.json"
    spec.write_text(
        json.dumps(
            {"target": target, "draft": draft, "tokens": tokens, "out": str(out)}
        )
    )
    launch = Path(sys.executable).with_name("mlx.launch")
    cmd = [str(launch), "-n", "2", "--backend", "ring", "--", sys.executable,
           __file__, "--worker", str(spec)]  # fmt: skip
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


def _report(one: dict, two: dict, layers: int):
    c, b = two["collectives_per_forward"], two["bytes_per_token"]
    rows = [("1 process", one), ("2 ranks (ring, tensor)", two)]
    print(f"CPU: {platform.processor() or platform.machine()}")
    print(f"{'':24} {'plain tok/s':>12} {'DFlash tok/s':>13} {'speedup':>8} {'tau':>5}")
    for name, r in rows:
        print(f"{name:24} {r['plain_tps']:12.1f} {r['dflash_tps']:13.1f} "
              f"{r['speedup']:7.2f}x {r['tau']:5.2f}")  # fmt: skip
    ratio = two["speedup"] / one["speedup"]
    print(f"collectives per verified block: {c} all-reduces ({c // layers} per layer), "
          f"the same for 1 or 8 tokens; bytes per token verified: {b}")  # fmt: skip
    print(f"all-reduce latency: {two['all_sum_1_s'] * 1e6:.0f} us (1 row), "
          f"{two['all_sum_8_s'] * 1e6:.0f} us (8 rows)")  # fmt: skip
    per_token = c * two["all_sum_1_s"]
    amortised = per_token / two["tau"]
    print(f"cost model: plain decoding pays {c} x latency = {per_token * 1e3:.2f} ms "
          f"per token; DFlash pays it once per block, {amortised * 1e3:.2f} ms per "
          f"token at tau {two['tau']:.2f}")  # fmt: skip
    print(f"DFlash speedup under 2 ranks / on 1 process: {ratio:.2f}")
    print(json.dumps({"one": one, "two": two, "ratio": ratio}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return _worker(args.worker)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target, draft = make_pair(root, "qwen3", args.hidden, args.layers, block_size=8)
        one = measure(target, draft, args.tokens, distributed=False)
        two = _two_ranks(target, draft, args.tokens, root)
    _report(one, two, args.layers)


if __name__ == "__main__":
    main()
