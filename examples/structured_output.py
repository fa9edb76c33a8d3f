"""JSON-schema output: DFlash against plain constrained decoding, same schema, same run.

    python examples/structured_output.py                       # the built-in pair
    python examples/structured_output.py --prompts 4 --max-tokens 96 --block-size 8
    python examples/structured_output.py --model M --draft D --schema s.json

Each prompt asks for a record about a person; both engines decode it greedily under
the same JSON schema (llguidance: the `structured` extra), plain decoding first, after
one warm-up each. Per prompt: tokens, tok/s of each, whether the tokens are identical,
whether the answer is valid against the schema, and the grammar's cost: the seconds
spent in the matcher (follow the history, roll back, compute the mask) as a share of
the decode time. One table, then one JSON line. Say which CPU ran it (printed first).
"""

import argparse
import json
import time
from pathlib import Path

from dflash_mlx import load, load_draft, stream_generate
from dflash_mlx.bench import chat_ids, environment
from dflash_mlx.engine.loop import as_target
from dflash_mlx.structured import Grammars, GrammarSpec

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 40},
        "skills": {
            "type": "array",
            "items": {"type": "string", "maxLength": 30},
            "maxItems": 4,
        },
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "skills", "employed"],
    "additionalProperties": False,
}
PEOPLE = [
    "Maria Lopez, 34, a nurse in Madrid who speaks three languages and runs marathons.",
    "Tom Becker, 52, an unemployed carpenter from Hamburg who builds boats.",
    "Aiko Tanaka, 27, a software engineer in Osaka who plays the violin.",
    "Samuel Okafor, 41, a teacher in Lagos who coaches football and writes poems.",
    "Lena Nilsson, 19, a student in Uppsala studying physics and chess.",
    "Raj Patel, 63, a retired pilot living in Leicester who gardens and cooks.",
    "Chloe Martin, 30, a baker in Lyon who paints and climbs.",
    "Diego Silva, 45, a fisherman in Porto who repairs nets and sings fado.",
]


class TimedMatcher:
    """The matcher, with the seconds spent in its calls added up."""

    def __init__(self, matcher):
        self.matcher, self.seconds = matcher, 0.0

    def __getattr__(self, name):
        method = getattr(self.matcher, name)

        def timed(*args):
            tick = time.perf_counter()
            try:
                return method(*args)
            finally:
                self.seconds += time.perf_counter() - tick

        return timed


def valid(text: str, schema: dict) -> bool:
    """The answer parses and has the schema's required keys of the right types (the
    grammar enforces the rest)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    kinds = {"string": str, "integer": int, "boolean": bool, "array": list}
    props = schema.get("properties", {})
    return isinstance(value, dict) and all(
        key in value
        and isinstance(value[key], kinds.get(props[key].get("type"), object))
        for key in schema.get("required", [])
    )


def decode(model, draft, tok, ids, grammars, spec, args):
    """(tokens, text, decode seconds, blocks, matcher seconds) of one answer."""
    processor = grammars.processor(spec)
    processor.matcher = TimedMatcher(processor.matcher)
    tokens, text, blocks, start = [], "", 0, None
    for r in stream_generate(
        model, draft, tok, ids, max_tokens=args.max_tokens,
        block_size=args.block_size if draft is not None else 1,
        logits_processors=[processor],
    ):  # fmt: skip
        if start is None:  # the prefill's token: decoding starts now
            start, grammar_at_start = time.perf_counter(), processor.matcher.seconds
        else:
            blocks += 1
        tokens += r.tokens
        text += r.text
    seconds = time.perf_counter() - start
    grammar = processor.matcher.seconds - grammar_at_start
    return tokens, text, seconds, blocks, grammar


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="Target (default: the built-in).")
    p.add_argument("--draft", default=None, help="Drafter (default: the built-in).")
    p.add_argument(
        "--schema", type=Path, help="A JSON schema file (default: a person)."
    )
    p.add_argument("--prompts", type=int, default=len(PEOPLE))
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--block-size", default="auto", help="An int or 'auto'.")
    args = p.parse_args(argv)
    if args.block_size != "auto":
        args.block_size = int(args.block_size)
    schema = json.loads(args.schema.read_text()) if args.schema else SCHEMA
    model, tok = load(args.model)
    draft = load_draft(args.draft, target=model)
    env = environment(model, draft, args.model or "built-in", args.draft or "built-in")
    print(f"# {env['chip'] or env['cpu']}, {env['device']}, {env['blas']}")
    grammars = Grammars(tok, as_target(model, draft).vocab_size)
    spec = GrammarSpec.json_schema(schema)
    prompts = [
        chat_ids(
            tok,
            [{"role": "user", "content": f"Describe this person as JSON: {person}"}],
            False,
        )
        for person in PEOPLE[: args.prompts]
    ]
    for engine in (None, draft):  # warm-ups
        decode(model, engine, tok, prompts[0], grammars, spec, args)
    rows = []
    for i, ids in enumerate(prompts):
        plain = decode(model, None, tok, ids, grammars, spec, args)
        fast = decode(model, draft, tok, ids, grammars, spec, args)
        n = len(fast[0]) - 1
        rows.append(
            {
                "prompt": i,
                "tokens": len(fast[0]),
                "plain_tps": n / plain[2],
                "dflash_tps": n / fast[2],
                "identical": plain[0] == fast[0],
                "valid": valid(fast[1], schema),
                "blocks": fast[3],
                "grammar_share": fast[4] / fast[2],
            }
        )
        r = rows[-1]
        speedup = r["dflash_tps"] / r["plain_tps"]
        print(
            f"{i:>3} {r['tokens']:>5} tok  plain {r['plain_tps']:7.1f} tok/s  "
            f"DFlash {r['dflash_tps']:7.1f} tok/s  x{speedup:.2f}  "
            f"identical={r['identical']} valid={r['valid']}  "
            f"grammar {100 * r['grammar_share']:.1f}% of decode"
        )
    plain_s = sum((r["tokens"] - 1) / r["plain_tps"] for r in rows)
    fast_s = sum((r["tokens"] - 1) / r["dflash_tps"] for r in rows)
    summary = {
        "speedup": plain_s / fast_s,
        "valid": sum(r["valid"] for r in rows) / len(rows),
        "identical": all(r["identical"] for r in rows),
        "grammar_share": sum(
            r["grammar_share"] * (r["tokens"] - 1) / r["dflash_tps"] for r in rows
        )
        / fast_s,
        "rows": rows,
        "environment": env,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
