"""What the chat's answer view costs: the same greedy answer on the built-in pair,
decoded with no view, the raw view and the Markdown view (on a terminal console writing
to /dev/null), interleaved; per answer, tok/s and the share of the answer's time (wall
and CPU) spent drawing.

    python examples/chat_render_cost.py [--tokens 512] [--rounds 3] [--prompt TEXT]
"""

import argparse
import os
import statistics
import time

from rich.console import Console

from dflash_mlx.chat import Settings
from dflash_mlx.cli import answer_ui, ui
from dflash_mlx.cli.session import open_session

PROMPT = (
    "Write a Python function that parses a CSV file, with a short explanation, a "
    "bulleted list of edge cases and an example."
)
KINDS = ("none", "raw", "markdown")


def line(stats, final: bool):
    return (ui.summary_line if final else ui.status_line)(stats)


def answer(session, out, kind: str, prompt: str = PROMPT) -> dict:
    """One answer from a fresh cache; the time in the view, wall and CPU."""
    session.reset()
    view = None
    if kind != "none":
        view = answer_ui.AnswerView(out, line, markdown=kind == "markdown")
        view.__enter__()
    wall, cpu, view_cpu = time.perf_counter(), time.process_time(), 0.0
    for chunk in session.stream(prompt):
        if view is not None:
            tic = time.process_time()
            view.update(chunk)
            view_cpu += time.process_time() - tic
    if view is not None:
        tic = time.process_time()
        view.__exit__(None, None, None)
        view_cpu += time.process_time() - tic
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    st = session.turns[-1]
    return {
        "tokens": st.generation_tokens,
        "tps": st.generation_tps,
        "wall_share": (view.render_seconds if view else 0.0) / wall,
        "cpu_share": view_cpu / cpu,
        "text": session.messages[-1]["content"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", default=PROMPT)
    args = parser.parse_args()
    session, _ = open_session(
        None, None, False, settings=Settings(max_tokens=args.tokens)
    )
    session.reuse_cache = False  # every answer prefills the same prompt afresh
    out = Console(file=open(os.devnull, "w"), force_terminal=True, width=100, height=40)
    answer_ui.warm_up(out)
    answer(session, out, "none", args.prompt)  # warm
    runs: dict[str, list[dict]] = {k: [] for k in KINDS}
    for r in range(args.rounds):
        for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
            run = answer(session, out, kind, args.prompt)
            runs[kind].append(run)
            print(
                f"round {r} {kind:8s} {run['tokens']} tok {run['tps']:6.2f} tok/s  "
                f"view {100 * run['wall_share']:.2f}% of the wall time, "
                f"{100 * run['cpu_share']:.2f}% of the CPU time",
                flush=True,
            )
    texts = {run["text"] for rows in runs.values() for run in rows}
    print(f"identical answers: {len(texts) == 1}")
    for kind, rows in runs.items():
        tps = statistics.median(run["tps"] for run in rows)
        share = statistics.median(run["wall_share"] for run in rows)
        print(f"{kind:8s} median {tps:.2f} tok/s, view {100 * share:.2f}% of the time")


if __name__ == "__main__":
    main()
