"""Where a block's time goes, on our native kernels or MLX's generic ones (a Mac's
path): wall time per block, syncs per block, MLX ops in one block's graph (drafter
forward, verify with acceptance), and the Python time of the engine's pieces.

    python examples/block_profile.py                       # native, then generic
    python examples/block_profile.py --kernels mlx --family qwen3_5 --block-size auto

A small random pair (64-wide by default), so the numbers are per-block overhead: on a
Mac, CPU time spent encoding and scheduling work around the GPU. Say which CPU ran it
(printed first).
"""

import argparse
import contextlib
import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path

from random_pair import make_pair

# (label, function name in the profile): the engine's pieces, in block order
PIECES = [
    ("plan + launch (builds the graphs)", "launch"),
    ("  absorb (drafter context)", "absorb"),
    ("  drafter forward (graph)", "draft_block"),
    ("  target verify (graph)", "__call__ (target.py)"),
    ("resolve (waits for the block: the sync)", "resolve"),
    ("rollback", "rollback"),
    ("policy observe", "observe"),
    ("policy cut (a second sync)", "cut"),
    ("feature tap (LayerTap calls)", "__call__ (taps.py)"),
]


def count_ops(*arrays) -> int:
    """MLX operations in the lazy graph behind `arrays` (a compiled piece counts 1)."""
    import mlx.core as mx

    out = io.StringIO()
    mx.export_to_dot(out, *arrays)
    return out.getvalue().count("shape=rectangle")


def block_ops(model, draft, tok, prompt, size: int) -> dict:
    """Ops in one drafter forward and one verify (with the greedy acceptance), built on
    a throwaway cache."""
    import mlx.core as mx

    from dflash_mlx import make_prompt_cache, stream_generate
    from dflash_mlx.engine.loop import as_target
    from dflash_mlx.engine.step import draft_block
    from dflash_mlx.engine.verify import greedy_result
    from dflash_mlx.models.draft_head import DraftHead
    from dflash_mlx.sampling import SamplingParams

    cache = make_prompt_cache(model, draft)
    last = list(stream_generate(model, draft, tok, prompt, max_tokens=1,
                                prompt_cache=cache))[-1].tokens[-1]  # fmt: skip
    target = as_target(model, draft)
    head = DraftHead.for_drafter(target, draft)
    block = mx.array([[last] + [draft.args.mask_token_id] * (size - 1)])
    drafts, _, confidence = draft_block(
        target, draft, head, cache, block, SamplingParams(), None
    )
    ops = {"drafter forward": count_ops(drafts, confidence)}
    mx.eval(drafts, confidence)
    ids = mx.concatenate([block[0, :1], drafts.astype(block.dtype)])[None]
    tape = [] if target.recurrent else None
    hidden, features = target(ids, cache.target, tape)
    result = greedy_result(drafts, target.logits(hidden)[0])
    ops["verify + acceptance"] = count_ops(result, features)
    return ops


def profile(model, draft, tok, prompt, args) -> tuple[float, int, dict]:
    """(wall ms per block unprofiled, blocks, {piece: (calls, Python ms per block)})."""
    from dflash_mlx import stream_generate

    def run():
        return list(
            stream_generate(
                model, draft, tok, prompt, max_tokens=args.max_tokens,
                block_size=args.block_size,
            )
        )  # fmt: skip

    run()  # warm-up: traces, compiled kernels
    walls = []
    for _ in range(args.repeats):
        tic = time.perf_counter()
        blocks = len(run()) - 1  # the first is the prefill's token
        walls.append((time.perf_counter() - tic) / blocks)
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    pieces = {}
    for label, name in PIECES:
        fn, _, where = name.partition(" (")
        calls, cum = 0, 0.0
        for (file, _, func), (_, ncalls, _, ct, _) in stats.items():
            if func == fn and "dflash_mlx" in file and where.rstrip(")") in file:
                calls, cum = calls + ncalls, cum + ct
        pieces[label] = (calls / blocks, 1e3 * cum / blocks)
    # the block's one sync is `resolve`; a cut evaluates the drafts first, a second one
    syncs = pieces["resolve (waits for the block: the sync)"][0]
    pieces["syncs (resolve + cut)"] = (
        syncs + pieces["policy cut (a second sync)"][0],
        0.0,
    )
    return 1e3 * sorted(walls)[len(walls) // 2], blocks, pieces


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="qwen3")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--block-size", default="16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kernels", default="device,mlx", help="comma list: device, mlx")
    args = p.parse_args()
    if args.block_size != "auto":
        args.block_size = int(args.block_size)

    import dflash_mlx
    from dflash_mlx import backend

    print(f"CPU: {backend.cpu_name()}, BLAS: {backend.blas_in_use()['name']}")
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_pair(Path(tmp), args.family, args.hidden, args.layers)
        for name in args.kernels.split(","):
            kernels = backend.named(name)
            with backend.forced(kernels) if kernels else contextlib.nullcontext():
                model, tok = dflash_mlx.load(paths[0])
                tok.eos_token_ids = set()  # random weights: full-length answers
                draft = dflash_mlx.load_draft(paths[1])
                prompt = tok.encode("Where does a block's time go? ")
                size = 16 if args.block_size == "auto" else args.block_size
                ops = block_ops(model, draft, tok, prompt, size)
                wall, blocks, pieces = profile(model, draft, tok, prompt, args)
            print(f"\n{args.family}, kernels {name}, block {args.block_size}: "
                  f"{wall:.2f} ms a block ({blocks} blocks, median of "
                  f"{args.repeats}); ops in a block of {size}: "
                  + ", ".join(f"{k} {v}" for k, v in ops.items()))  # fmt: skip
            header = "piece (profiled: Python time inflated)"
            print(f"{header:<44} {'calls':>6} {'ms':>7}")
            for label, (calls, ms) in pieces.items():
                print(f"{label:<44} {calls:>6.2f} {ms:>7.3f}")


if __name__ == "__main__":
    main()
