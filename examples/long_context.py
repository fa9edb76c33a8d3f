"""Agent-length context: DFlash against plain decoding, prompt length by prompt length.

    python examples/long_context.py                          # the built-in pair, to 7K
    python examples/long_context.py --lengths 2048,8192,32768 --model M --draft D
    python examples/long_context.py --pair tiny --lengths 2048,16384,65536

Prompts are agent-shaped (dflash_mlx/bench/agent_prompts.py: tool docs, files read,
tool results, then a request that restates a file ("edit") or answers in prose), built
to each length with the model's own tokenizer. Per length and kind, each engine (mlx-lm,
this package's plain decoding, DFlash auto) decodes greedily once after a warm-up:
time to first token and prefill tok/s, decode tok/s, tau and blocks by source, peak
memory, and whether its tokens equal mlx-lm's. Per length also: the drafter's forward
(one block) and the target's verify of a block against one decoding step, at that
context. `--pair tiny` is a random 64K-context pair (random_pair.py): mechanics and
costs only, no acceptance. One table, then one JSON line. Say which CPU ran it
(printed first).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

from dflash_mlx import load, load_draft
from dflash_mlx.bench import (
    chat_ids,
    dflash_engine,
    environment,
    measure,
    mlx_lm_engine,
    plain_engine,
)
from dflash_mlx.bench.agent_prompts import KINDS, agent_prompt


def _load(args):
    if args.pair == "tiny":
        from random_pair import make_pair

        folder = Path(tempfile.mkdtemp(prefix="long-context-"))
        t, d = make_pair(
            folder, "qwen3", hidden=256, layers=8, max_position_embeddings=70000
        )
        window = args.draft_window
        return (*load(str(t)), load_draft(str(d), sliding_window_size=window))
    model, tok = load(args.model)
    if args.draft == "none":  # prompt lookup alone (a target without a drafter)
        return model, tok, None
    draft = load_draft(args.draft, target=model, sliding_window_size=args.draft_window)
    return model, tok, draft


def lookup(model, tok, kv_bits=None, kv_group_size=64):
    """Prompt lookup without a drafter: copies where the text repeats, else plain."""
    from dflash_mlx.bench.engines import block_info
    from dflash_mlx.generate import stream_generate

    def run(ids, max_tokens, block_size):
        for r in stream_generate(
            model, None, tok, ids, max_tokens=max_tokens, lookup=True,
            kv_bits=kv_bits, kv_group_size=kv_group_size,
        ):  # fmt: skip
            yield r.tokens, r.accepted, block_info(r)

    return run


def _timed(fn, reps: int = 5) -> float:
    """Median milliseconds of `fn()` (which evaluates its own result)."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def block_costs(model, draft, ids: list[int]) -> dict:
    """At this context, through the engine's own target side (models/target.py): the
    drafter's forward on one block, the target's forward on one token and on one
    block (each rolled back), in ms."""
    from dflash_mlx.models.target import Target

    B = draft.args.block_size if draft else 8
    target = Target(model, draft.args.target_layer_ids if draft else ())
    cache = target.make_cache(windows=True)  # as generate and chat make it
    dcache = draft.make_cache() if draft else []
    for i in range(0, len(ids), 2048):  # prefill as the engine does: chunked
        _, features = target(mx.array([ids[i : i + 2048]]), cache)
        if draft:
            draft.absorb(features, dcache)
        mx.eval([c.state for c in cache], [c.state for c in dcache])

    def forward(n):
        tape: list = []
        mx.eval(target(mx.array([ids[-n:]]), cache, tape))
        target.rollback(cache, tape, n, 0)

    block = target.embed(mx.array([ids[-B:]]))
    return dict(
        draft_ms=_timed(lambda: mx.eval(draft(block, dcache))) if draft else None,
        step_ms=_timed(lambda: forward(1)),
        verify_ms=_timed(lambda: forward(B)),
        block=B,
    )


def _row(r: dict, ids: list[int], baseline: list[int]) -> dict:
    """One engine's measurement (bench.measure) as a table row."""
    taus, sources = r["accept_lengths"], r["sources"]
    return dict(
        prompt_tokens=len(ids),
        ttft_s=r["ttft_s"],
        prefill_tps=len(ids) / r["ttft_s"],
        decode_tps=r["decode_tps"],
        tokens=r["tokens"],
        tau=statistics.fmean(taus) if taus else None,
        sources={s or "plain": sources.count(s) for s in set(sources)},
        peak_gb=r["peak_memory_gb"],
        same_as_mlx_lm=r["output"] == baseline,
    )


def run_length(engines, tok, model, draft, length, args) -> list[dict]:
    """Every kind of prompt at `length` tokens under every engine (mlx-lm first: the
    tokens the others must equal), and the block costs at that context."""
    count = lambda s: len(tok.encode(s, add_special_tokens=False))  # noqa: E731
    rows, costs = [], None
    for kind in args.kinds:
        prompt = agent_prompt(count, length, kind)
        ids = chat_ids(tok, [{"role": "user", "content": prompt}], False)
        costs = costs or block_costs(model, draft, ids)
        baseline = None
        for name, engine in engines.items():
            r = measure(engine, ids, args.max_tokens, "auto")
            baseline = r["output"] if baseline is None else baseline
            info = dict(length=length, kind=kind, engine=name, **costs)
            rows.append(info | _row(r, ids, baseline))
    return rows


def print_table(rows: list[dict]):
    head = "length kind  engine  prompt  TTFT s  prefill/s  decode/s  ratio  tau  "
    print(head + "blocks (source)            peak GB  same")
    plain = {(r["length"], r["kind"]): r["decode_tps"] for r in rows if r["engine"]
             == "plain"}  # fmt: skip
    for r in rows:
        ratio = r["decode_tps"] / plain[(r["length"], r["kind"])]
        tau = f"{r['tau']:.2f}" if r["tau"] else "  - "
        src = ",".join(f"{k}:{v}" for k, v in sorted(r["sources"].items())) or "-"
        print(
            f"{r['length']:>6} {r['kind']:5} {r['engine']:7} {r['prompt_tokens']:>6} "
            f"{r['ttft_s']:>6.2f} {r['prefill_tps']:>9.0f} {r['decode_tps']:>9.1f} "
            f"{ratio:>5.2f} {tau:>4} {src:26} {r['peak_gb']:>6.2f}  "
            f"{r['same_as_mlx_lm']}"
        )
    print("\nlength  drafter ms/block  target ms/step  verify ms/block (B)")
    for length in dict.fromkeys(r["length"] for r in rows):
        r = next(x for x in rows if x["length"] == length)
        draft_ms = f"{r['draft_ms']:.1f}" if r["draft_ms"] else "-"
        print(f"{length:>6} {draft_ms:>17} {r['step_ms']:>15.1f} "
              f"{r['verify_ms']:>16.1f} ({r['block']})")  # fmt: skip


def main():
    if sys.platform.startswith("linux"):  # as the CLI: OpenBLAS, freed memory kept
        from dflash_mlx.cpu.blas import ensure_fast_blas
        from dflash_mlx.heap import keep_freed_memory

        ensure_fast_blas()
        keep_freed_memory()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", choices=["given", "tiny"], default="given")
    p.add_argument("--model", default=None, help="target (default: built-in)")
    p.add_argument(
        "--draft", default=None, help="drafter (default: the registry's; none: lookup)"
    )
    p.add_argument("--lengths", default=None, help="prompt tokens, comma-separated")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--engines", default="mlx-lm,plain,dflash")
    p.add_argument(
        "--draft-window",
        type=lambda v: None if v == "none" else v if v == "auto" else int(v),
        default="auto",
        help="the drafter's context: auto (the default bound), none (all), or tokens",
    )
    p.add_argument(
        "--kv-bits", type=int, choices=[4, 8], default=None,
        help="quantize the target's KV cache (every engine, from the first token)",
    )  # fmt: skip
    p.add_argument("--kv-group-size", type=int, default=64)
    p.add_argument(
        "--kernels", choices=["device", "mlx"], default="device",
        help="mlx: MLX's generic kernels, the ones a Mac's GPU runs",
    )  # fmt: skip
    args = p.parse_args()
    args.kinds = args.kinds.split(",")
    from dflash_mlx import backend

    chosen = backend.named(args.kernels)
    if chosen is not None:
        backend.forced(chosen).__enter__()  # for the whole run
    model, tok, draft = _load(args)
    context = getattr(model.args, "max_position_embeddings", None) or 8192
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else [
        n for n in (2048, 4096, 7168, 16384, 32768, 65536) if n < context]  # fmt: skip
    lengths = [n for n in lengths if n + args.max_tokens <= context]
    from mlx_lm.sample_utils import make_sampler

    kv = dict(kv_bits=args.kv_bits, kv_group_size=args.kv_group_size)
    every = {
        "mlx-lm": mlx_lm_engine(model, tok, make_sampler(0.0), **kv),
        "plain": plain_engine(model, tok, **kv),
        "dflash": dflash_engine(model, draft, tok, **kv)
        if draft
        else lookup(model, tok, **kv),
    }
    engines = {k: every[k] for k in args.engines.split(",")}
    env = environment(model, draft)
    print(f"CPU {env['cpu']} ({env['cpu_vectors']}), {env['device']}, BLAS "
          f"{env['blas']}; context {context}; lengths {lengths}; "
          f"kv_bits {args.kv_bits}")  # fmt: skip
    warm = chat_ids(tok, [{"role": "user", "content": "Say hello."}], False)
    for engine in engines.values():
        for _ in engine(warm, 16, "auto"):
            pass
    rows = []
    for length in lengths:
        rows += run_length(engines, tok, model, draft, length, args)
    print_table(rows)
    print(json.dumps(dict(environment=env, rows=rows)))


if __name__ == "__main__":
    main()
