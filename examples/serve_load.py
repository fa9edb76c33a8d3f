"""Load benchmark: N concurrent clients against `dflash-mlx serve` and `mlx_lm.server`.

    python examples/serve_load.py                       # default pair, 1/4/8/16 clients
    python examples/serve_load.py --model M --draft D --clients 1,4,8 --requests 4
    python examples/serve_load.py --servers dflash,dflash-plain --kernels mlx \
        --clients 1,2,4,8 --trace /tmp/traces     # drafter against --no-draft

Each server is started in turn on the same target (a GGUF target is exported once to an
MLX folder for `mlx_lm.server`, which cannot read GGUF), warmed up with one whole
answer, then driven by N client threads that stream the same gsm8k chat completions
(greedy, usage included) at every N: `--requests` x the largest N prompts, each client
taking the next one when its answer ends (before 2026-12-05 each client had its own
`--requests` prompts, so 1 client measured 4 prompts and 8 clients 32: rows compared
different work). Per server and N: requests/s,
TTFT p50/p95, per-client decode tok/s, aggregate tok/s and errors; then whether every
greedy answer of dflash equals mlx-lm's. A table, then one JSON line. Only `httpx` is
needed on the client side.

`dflash-plain` is the same server with `--no-draft` (its own plain batching: the
drafter's worth at each N); `--kernels mlx` runs both on MLX's generic kernels (a Mac's
path); `--trace DIR` has each dflash server write its step trace there (`serve
--trace`); `--ui-open` keeps the dashboard's event stream open through each run (what
the page costs).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="target (default: the built-in one)")
    p.add_argument("--draft", help="DFlash drafter (default: the target's)")
    p.add_argument("--clients", default="1,4,8,16", help="comma list of client counts")
    p.add_argument(
        "--requests",
        type=int,
        default=4,
        help="requests per client at the most clients (every row serves those prompts)",
    )
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--dataset", default="gsm8k")
    p.add_argument("--servers", default="dflash,mlx-lm")
    p.add_argument("--port", type=int, default=8181)
    p.add_argument("--block-size", default="auto")
    p.add_argument("--json", help="write every request's record to this file")
    p.add_argument("--kernels", choices=["device", "mlx"], default="device")
    p.add_argument("--trace", help="a folder for the dflash servers' step traces")
    p.add_argument(
        "--ui-open", action="store_true", help="the dashboard's stream open meanwhile"
    )
    return p.parse_args()


def mlx_lm_folder(model_ref: str) -> str:
    """A path `mlx_lm.server` can load: the model itself, or a GGUF exported once."""
    if not model_ref.endswith(".gguf"):
        return model_ref
    from mlx_lm.utils import save_config, save_model

    from dflash_mlx import load
    from dflash_mlx.gguf.arch import model_config
    from dflash_mlx.gguf.file import read_header

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    out = cache / "dflash-mlx" / "mlx-export" / Path(model_ref).stem
    if (out / "config.json").exists():
        return str(out)
    model, tokenizer = load(model_ref)  # dequantized, rows in Hugging Face order
    config = model_config(read_header(model_ref))
    config["eos_token_id"] = sorted(tokenizer.eos_token_ids)
    save_model(out, model)
    save_config(config, out / "config.json")
    tokenizer.save_pretrained(str(out))
    return str(out)


def fast_blas_env() -> dict:
    """The environment with OpenBLAS preloaded where installed (as dflash-mlx does)."""
    from dflash_mlx.cpu.blas import find_openblas

    env = dict(os.environ)
    lib = find_openblas()
    if lib and sys.platform.startswith("linux"):
        env["LD_PRELOAD"] = lib
    return env


def servers_blas() -> str:
    """The BLAS both servers run on (they get `fast_blas_env`)."""
    from dflash_mlx.bench import detect_blas

    preload = fast_blas_env().get("LD_PRELOAD")
    if sys.platform.startswith("linux") and preload:
        return f"OpenBLAS ({preload}), preloaded in both servers"
    return detect_blas()


def start(kind: str, args, target: str, draft: str | None, port: int, width: int):
    if kind.startswith("dflash"):
        cmd = [sys.executable, "-m", "dflash_mlx.cli.main", "--kernels", args.kernels]
        cmd += ["serve", "--model", target]
        plain = kind == "dflash-plain" or not draft
        cmd += ["--no-draft"] if plain else ["--draft", draft]
        cmd += ["--port", str(port), "--block-size", args.block_size]
        if args.trace:
            Path(args.trace).mkdir(parents=True, exist_ok=True)
            cmd += ["--trace", str(Path(args.trace) / f"{kind}-{args.kernels}.jsonl")]
        cmd += ["--max-concurrency", str(width), "--max-queue", "256"]
        cmd += ["--max-tokens", str(max(args.max_tokens, 1))]
    else:
        cmd = [sys.executable, "-m", "mlx_lm.server", "--model", mlx_lm_folder(target)]
        cmd += ["--port", str(port), "--max-tokens", str(args.max_tokens)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=fast_blas_env()
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{kind} server exited: {proc.stderr.read().decode()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{kind} server did not start in 10 minutes")


def model_name(kind: str, url: str) -> str:
    if not kind.startswith("dflash"):
        return "default_model"  # mlx_lm.server: the model it was started with
    return httpx.get(url + "/v1/models").json()["data"][0]["id"]


def stream_one(http: httpx.Client, url: str, model: str, prompt: str, max_tokens: int):
    """One streamed greedy chat completion: timings, token count, text, error."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    tic = time.perf_counter()
    first, text, tokens, error = None, "", 0, None
    try:
        with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                r.read()
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"].get("message"))
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    piece = (choice.get("delta") or {}).get("content") or ""
                    if piece and first is None:
                        first = time.perf_counter()
                    text += piece
    except Exception as e:  # counted, reported, never fatal
        error = str(e)
    end = time.perf_counter()
    first = first or end
    decode = (tokens - 1) / (end - first) if tokens > 1 and end > first else None
    return {
        "ttft_s": first - tic,
        "seconds": end - tic,
        "tokens": tokens,
        "decode_tps": decode,
        "text": text,
        "error": error,
    }


def run_clients(url, model, prompts, clients, max_tokens):
    """Every prompt once, `clients` at a time: each client streams the next prompt
    not yet taken when its last answer ends (every row serves the same prompts, so
    rows compare the same work)."""
    queue = iter(enumerate(prompts))
    lock = threading.Lock()

    def client(i):
        with httpx.Client(timeout=3600) as http:
            out = []
            while True:
                with lock:
                    k, prompt = next(queue, (None, None))
                if k is None:
                    return out
                rec = stream_one(http, url, model, prompt, max_tokens)
                out.append({**rec, "prompt": k, "client": i})

    tic = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        records = [r for rs in pool.map(client, range(clients)) for r in rs]
    return records, time.perf_counter() - tic


class Dashboard:
    """The dashboard's event stream (`/ui/api/events`), read in a thread meanwhile, as
    an open page reads it."""

    def __init__(self, url: str):
        self.http = httpx.Client(timeout=None)
        self.events, self.stop = 0, False
        self.thread = threading.Thread(target=self._read, args=(url,), daemon=True)
        self.thread.start()

    def _read(self, url: str):
        try:
            with self.http.stream("GET", url + "/ui/api/events") as r:
                for line in r.iter_lines():
                    if self.stop:
                        return
                    self.events += line.startswith("data:")
        except httpx.HTTPError:
            pass

    def close(self):
        self.stop = True
        self.http.close()


def trace_summary(path: Path) -> dict:
    """Per rows verified together and block size: steps, mean step, verify, draft
    and upkeep ms (from `serve --trace`); and the prefill's total."""
    steps: dict = {}
    prefill_ms = 0.0
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == "prefill":
            prefill_ms += r["prefill_ms"]
            continue
        s = steps.setdefault((r["rows"], r["size"]), [])
        s.append(r)
    out = {}
    for (rows, size), rs in sorted(steps.items()):
        means = {
            k: round(statistics.fmean(r.get(f"{k}_ms", 0.0) for r in rs), 2)
            for k in ("step", "verify", "draft", "upkeep")
        }
        tokens = statistics.fmean(r["tokens"] for r in rs)
        out[f"{rows}x{size}"] = {"steps": len(rs), "tokens_per_step": tokens, **means}
    return {"steps": out, "prefill_ms": round(prefill_ms, 1)}


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summarize(kind, clients, records, wall):
    ok = [r for r in records if r["error"] is None]
    ttft = [r["ttft_s"] for r in ok] or [float("nan")]
    decode = [r["decode_tps"] for r in ok if r["decode_tps"]]
    return {
        "server": kind,
        "clients": clients,
        "requests": len(records),
        "errors": len(records) - len(ok),
        "requests_per_s": len(ok) / wall,
        "ttft_p50_s": percentile(ttft, 0.5),
        "ttft_p95_s": percentile(ttft, 0.95),
        "client_decode_tps": statistics.mean(decode) if decode else None,
        "aggregate_tps": sum(r["tokens"] for r in ok) / wall,
    }


def print_table(rows):
    head = f"{'server':12} {'N':>3} {'req':>4} {'err':>3} {'req/s':>6} {'TTFT p50':>9} "
    head += f"{'TTFT p95':>9} {'tok/s/client':>12} {'tok/s total':>11}"
    print(head)
    for r in rows:
        per_client = r["client_decode_tps"]
        per_client = "-" if per_client is None else f"{per_client:.1f}"
        ttft = f"{r['ttft_p50_s']:>8.2f}s {r['ttft_p95_s']:>8.2f}s"
        print(
            f"{r['server']:12} {r['clients']:>3} {r['requests']:>4} {r['errors']:>3} "
            f"{r['requests_per_s']:>6.2f} {ttft} {per_client:>12} "
            f"{r['aggregate_tps']:>11.1f}"
            + (
                f"  dashboard events {r['dashboard_events']}"
                if "dashboard_events" in r
                else ""
            )
        )


def main():
    args = parse_args()
    from dflash_mlx.datasets import load_dataset
    from dflash_mlx.loading.resolve import resolve_models

    target, draft, _ = resolve_models(args.model, args.draft)
    counts = [int(c) for c in args.clients.split(",")]
    need = max(counts) * args.requests
    *prompts, spare = [s.turns[0] for s in load_dataset(args.dataset, need + 1)]
    rows, texts, everything = [], {}, []
    for kind in args.servers.split(","):
        proc, url = start(kind, args, target, draft, args.port, max(counts))
        try:
            model = model_name(kind, url)
            with httpx.Client(timeout=3600) as http:
                # warm-up: a whole answer, so that the first row measured (1 client)
                # does not pay what a server pays once (first shapes, and the adaptive
                # block size's first blocks: 1 client measured first was 15-20% slower
                # than the same 1 client measured after 8)
                stream_one(http, url, model, spare, args.max_tokens)
            for n in counts:
                watcher = Dashboard(url) if args.ui_open else None
                records, wall = run_clients(url, model, prompts, n, args.max_tokens)
                rows.append(summarize(kind, n, records, wall))
                if watcher is not None:
                    watcher.close()
                    rows[-1]["dashboard_events"] = watcher.events  # it was live
                everything += [{**r, "server": kind, "clients": n} for r in records]
                for r in records:
                    texts.setdefault(kind, {}).setdefault(r["prompt"], set()).add(
                        r["text"]
                    )
        finally:
            proc.terminate()
            proc.wait(60)
    blas = servers_blas()
    print(f"target {target}  drafter {draft}  BLAS {blas}  kernels {args.kernels}")
    print_table(rows)
    identical = {}  # each server's answers against the first server's
    first, *others = list(texts)
    for kind in others:
        shared = set(texts[first]) & set(texts[kind])
        same = all(texts[first][k] == texts[kind][k] for k in shared)
        identical[kind] = same
        print(f"greedy answers of {kind} identical to {first}'s: {same} "
              f"({len(shared)} prompts)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1) + "\n")
    record = {"rows": rows, "identical": identical, "blas": blas}
    if args.trace:
        record["traces"] = {}
        for path in sorted(Path(args.trace).glob(f"*-{args.kernels}.jsonl")):
            summary = trace_summary(path)
            record["traces"][path.stem] = summary
            print(f"\n{path.stem} (prefill {summary['prefill_ms']} ms): rows x size:")
            print("   steps  tokens/step  ms: step  verify  draft  upkeep")
            for key, v in summary["steps"].items():
                ms = " ".join(
                    f"{v[k]:>7}" for k in ("step", "verify", "draft", "upkeep")
                )
                print(f"  {key:>6} {v['steps']:>5} {v['tokens_per_step']:>9.2f} {ms}")
    print(json.dumps(record | {"kernels": args.kernels}))


if __name__ == "__main__":
    main()
