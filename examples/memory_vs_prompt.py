"""Peak memory against prompt length: does it grow no faster than the KV caches?

    python examples/memory_vs_prompt.py [--family qwen3] \\
        [--lengths 1024,2048,4096,8192,16384] [--kv-bits 8 --head-dim 64]

Builds a small random target + drafter (random_pair.py), then for each prompt length
runs stream_generate (chunked prefill, 16 new tokens) and plain mlx-lm decoding, and
reports both peaks, the bytes held by the target and drafter caches, and the weights, as
a table and one JSON line. On the CPU backend the attention of a prefill chunk
materializes chunk x context scores, in mlx-lm as here: that term is linear in the
prompt too. With `--kv-bits`, both quantize the target's KV cache (mlx-lm from the
first token too: `quantized_kv_start=0`); `--head-dim` must then be a multiple of
`--kv-group-size`.
"""

import argparse
import json
import tempfile
from pathlib import Path

from random_pair import make_pair


def cache_bytes(caches) -> int:
    """Bytes of the arrays the caches hold (a quantized one's codes, scales, biases)."""
    from mlx.utils import tree_flatten

    flat = tree_flatten([c.state for c in caches or []])
    return sum(getattr(x, "nbytes", 0) for _, x in flat)


def weights_bytes(*models) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for m in models for _, v in tree_flatten(m.parameters()))


def measure(model, draft, tok, n: int, step: int, quant=None, mlx_lm_too=True) -> dict:
    """Peaks of this engine and of plain mlx-lm on an n-token prompt; cache sizes."""
    import mlx.core as mx
    import mlx_lm

    from dflash_mlx import make_prompt_cache, stream_generate

    prompt = (tok.encode("All work and no play makes Jack a dull boy. ") * n)[:n]
    cache = make_prompt_cache(model, draft, *(quant or (None, 64)))
    mx.clear_cache()
    mx.reset_peak_memory()
    ours = list(
        stream_generate(
            model,
            draft,
            tok,
            prompt,
            max_tokens=16,
            prompt_cache=cache,
            prefill_step_size=step,
        )
    )[-1]
    kv = cache_bytes(cache.target) + cache_bytes(cache.draft)
    draft_kv = cache_bytes(cache.draft)
    del cache
    mx.clear_cache()
    mx.reset_peak_memory()
    quantized = {}
    if quant is not None:
        bits, group = quant
        quantized = dict(kv_bits=bits, kv_group_size=group, quantized_kv_start=0)
    plain = None
    if mlx_lm_too:
        plain = list(
            mlx_lm.stream_generate(
                model, tok, prompt, max_tokens=16, prefill_step_size=step, **quantized
            )
        )[-1]
    return dict(
        prompt=n,
        peak_mb=round(ours.peak_memory * 1e3, 1),
        mlx_lm_peak_mb=round(plain.peak_memory * 1e3, 1) if plain else None,
        caches_mb=round(kv / 1e6, 1),
        draft_cache_mb=round(draft_kv / 1e6, 1),
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="qwen3")
    p.add_argument("--lengths", default="1024,2048,4096,8192,16384")
    p.add_argument("--prefill-step-size", type=int, default=2048)
    p.add_argument("--draft-window", type=int, default=None)
    p.add_argument("--kv-bits", type=int, default=None)
    p.add_argument("--kv-group-size", type=int, default=64)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--no-mlx-lm", action="store_true", help="skip mlx-lm's run")
    args = p.parse_args()
    kv = None if args.kv_bits is None else (args.kv_bits, args.kv_group_size)

    from dflash_mlx import load, load_draft

    with tempfile.TemporaryDirectory() as tmp:
        # the shapes of the measurements in docs/design-and-losslessness.md
        t, d = make_pair(
            Path(tmp),
            args.family,
            hidden=64,
            layers=4,
            block_size=8,
            intermediate_size=128,
            vocab_size=272,
            max_position_embeddings=args.context,
            head_dim=args.head_dim,
        )
        model, tok = load(t)
        draft = load_draft(d, sliding_window_size=args.draft_window)
        weights_mb = round(weights_bytes(model, draft) / 1e6, 1)
        rows = [
            {
                **measure(
                    model,
                    draft,
                    tok,
                    n,
                    args.prefill_step_size,
                    kv,
                    not args.no_mlx_lm,
                ),
                "weights_mb": weights_mb,
            }
            for n in [int(x) for x in args.lengths.split(",")]
        ]
    cols = list(rows[0]) if rows else []
    print(" ".join(f"{c:>15}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]!s:>15}" for c in cols))
    record = {
        "family": args.family,
        "prefill_step_size": args.prefill_step_size,
        "kv_bits": args.kv_bits,
        "kv_group_size": args.kv_group_size,
        "head_dim": args.head_dim,
        "rows": rows,
    }
    print(json.dumps(record))


if __name__ == "__main__":
    main()
