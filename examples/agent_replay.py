"""Agent replay: a scripted coding-agent session against `dflash-mlx serve` and
`mlx_lm.server` on the same target, to see what prefix reuse is worth.

    python examples/agent_replay.py                         # the built-in pair
    python examples/agent_replay.py --hybrid                # a tiny random qwen3_5 pair
    python examples/agent_replay.py --model M --draft D --turns 8
    python examples/agent_replay.py --repeats 3             # TTFT medians of 3 replays

Two conversations share one long system prompt with tool documentation (as agents
send). Each turn appends the assistant's previous answer and a tool result, and the
two conversations take turns, so each request resends the whole history while the
other conversation's requests run between. Every request is streamed (greedy). Per
server and turn: prompt tokens, tokens served from the cache (`cached_tokens`, where
the server reports it), tokens prefilled, time to first token (the median over the
conversations and repeats); then the total time of the first replay.
A table per server, then one JSON line. Only `httpx` is needed on the client side.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import fast_blas_env, model_name, start  # noqa: E402

TOOLS = ["read_file", "edit_file", "run_tests", "search_code", "list_files", "shell"]


def system_prompt(words: int) -> str:
    """An agent's system prompt: a role, then each tool's documentation, repeated
    (with the section numbered) until it has about `words` words."""
    parts = ["You are a coding agent. Use the tools to inspect and change the repo."]
    n = 0
    while sum(len(p.split()) for p in parts) < words:
        name = TOOLS[n % len(TOOLS)]
        parts.append(
            f'## Tool {n}: {name}\nCall it as {{"name": "{name}", "arguments": '
            f'{{"path": string, "query": string}}}}. It returns the result as text. '
            f"Use {name} only when the task needs it; explain what you do first."
        )
        n += 1
    return "\n\n".join(parts)


def tool_result(conversation: int, turn: int) -> str:
    lines = [
        f"def step_{conversation}_{turn}_{i}(x):\n    return x + {i}" for i in range(6)
    ]
    return f"Tool result (read_file src/module_{turn}.py):\n" + "\n".join(lines)


def request(http, url, model, messages, max_tokens) -> dict:
    body = {
        "model": model, "messages": messages, "max_tokens": max_tokens,
        "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    tic = time.perf_counter()
    first, text, usage = None, "", {}
    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            raise SystemExit(f"HTTP {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter()
                text += piece
    end = time.perf_counter()
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return {
        "ttft_s": (first or end) - tic,
        "seconds": end - tic,
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": cached,
        "text": text,
    }


def replay(url, model, args, first: int = 0) -> tuple[list[dict], float]:
    """One replay; its conversations are numbered from `first` (a repeat's own)."""
    system = system_prompt(args.system_words)
    numbers = range(first, first + args.conversations)
    histories = [
        [{"role": "system", "content": system},
         {"role": "user", "content": f"Task {c}: make the tests of module {c} pass."}]
        for c in numbers
    ]  # fmt: skip
    records = []
    tic = time.perf_counter()
    with httpx.Client(timeout=3600) as http:
        for turn in range(args.turns):
            for c, history in zip(numbers, histories, strict=True):
                rec = request(http, url, model, history, args.max_tokens)
                records.append({**rec, "turn": turn + 1, "conversation": c})
                history.append({"role": "assistant", "content": rec["text"]})
                history.append({"role": "user", "content": tool_result(c, turn)})
    return records, time.perf_counter() - tic


def table(kind: str, records: list[dict], total: float):
    """Per turn: mean prompt and cached tokens, median time to first token."""
    print(f"\n{kind}: total {total:.1f} s (the first replay)")
    print(f"{'turn':>4} {'prompt':>7} {'cached':>7} {'prefilled':>9} {'TTFT':>8}")
    for turn in sorted({r["turn"] for r in records}):
        rows = [r for r in records if r["turn"] == turn]
        prompt = statistics.mean(r["prompt_tokens"] or 0 for r in rows)
        cached = [r["cached_tokens"] for r in rows if r["cached_tokens"] is not None]
        shown = f"{statistics.mean(cached):7.0f}" if cached else f"{'-':>7}"
        filled = f"{prompt - statistics.mean(cached):9.0f}" if cached else f"{'-':>9}"
        ttft = statistics.median(r["ttft_s"] for r in rows)
        print(f"{turn:>4} {prompt:7.0f} {shown} {filled} {ttft:7.2f}s")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="target (default: the built-in one)")
    p.add_argument("--draft", help="DFlash drafter (default: the target's)")
    p.add_argument("--hybrid", action="store_true", help="a tiny random qwen3_5 pair")
    p.add_argument("--servers", default="dflash,mlx-lm")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--conversations", type=int, default=2)
    p.add_argument("--system-words", type=int, default=1200)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--block-size", default="auto")
    p.add_argument("--port", type=int, default=8282)
    p.add_argument(
        "--repeats", type=int, default=1,
        help="replays per server, each with conversations of its own (its first turn "
        "finds the system prompt cached): TTFT medians over all",
    )  # fmt: skip
    args = p.parse_args()
    args.requests, args.clients = 1, "1"  # what serve_load.start reads
    target, draft = args.model, args.draft
    if args.hybrid:
        from random_pair import make_pair

        folder = Path(tempfile.mkdtemp(prefix="agent-replay-"))
        # its byte tokenizer makes the history ~3x as many tokens as a real one's
        pair = make_pair(
            folder, "qwen3_5", hidden=256, layers=8, max_position_embeddings=32768
        )
        target, draft = map(str, pair)
    if target is None:
        from dflash_mlx.loading.defaults import default_draft, default_target

        target, draft = default_target(), draft or default_draft()
    from dflash_mlx.backend import cpu_name, detect_blas

    results = {}
    for kind in args.servers.split(","):
        proc, url = start(kind, args, target, draft, args.port, args.conversations)
        try:
            records, totals = [], []
            for r in range(args.repeats):
                got, total = replay(url, model_name(kind, url), args, first=r * 100)
                records += [{**rec, "repeat": r} for rec in got]
                totals.append(total)
            total = totals[0]
        finally:
            proc.terminate()
            proc.wait(60)
        table(kind, records, total)
        results[kind] = {"total_s": total, "records": records}
    # turn 1 only: from turn 2 on, dflash-mlx resends an answer's generated ids and
    # mlx_lm.server re-tokenizes its text, so the prompts may differ from there
    texts = {
        k: [r["text"] for r in v["records"] if r["turn"] == 1 and r["repeat"] == 0]
        for k, v in results.items()
    }
    same = len({json.dumps(t) for t in texts.values()}) == 1
    print(f"\nfirst answers identical across servers: {same}")
    print(f"cpu: {cpu_name()}; BLAS here: {detect_blas()}; both servers get OpenBLAS")
    summary = {
        k: {"total_s": round(v["total_s"], 2),
            "turns": [{key: r[key] for key in ("repeat", "turn", "conversation",
                       "prompt_tokens", "cached_tokens", "ttft_s")}
                      for r in v["records"]]}
        for k, v in results.items()
    }  # fmt: skip
    print(json.dumps({"identical": same, "env": fast_blas_env().get("LD_PRELOAD"),
                      "servers": summary}))  # fmt: skip


if __name__ == "__main__":
    main()
