"""A GGUF file's tokenizer, rebuilt from its metadata as a transformers fast tokenizer.

Byte-level BPE (`tokenizer.ggml.model` "gpt2": tokens, merges, token types and the
pre-tokenizer named by `tokenizer.ggml.pre`) or SentencePiece BPE ("llama": tokens,
scores, token types; `spm.py`) in mlx-lm's `TokenizerWrapper`, with the BOS/EOS/EOT ids
and the chat template from the metadata. transformers' own GGUF converter differs from
it on SmolLM2 and cannot build a vocabulary without merges (see docs/gguf.md), so it is
not used.
"""

# Pre-tokenizer split patterns by `tokenizer.ggml.pre` (as in the tokenizer.json files).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "gpt-4o": _GPT4O_SPLIT,  # gpt-oss (o200k_harmony)
}
# Vocabularies whose tokenizer.json says "ignore_merges": whole words in the vocabulary
# are taken as they are.
_IGNORE_MERGES = ("llama-bpe", "llama3", "gpt-4o")
CONTROL, USER_DEFINED = 3, 4


def build_tokenizer(md: dict):
    """An mlx-lm TokenizerWrapper from the GGUF tokenizer metadata (byte-level BPE)."""
    from functools import partial

    from mlx_lm.tokenizer_utils import (
        BPEStreamingDetokenizer,
        SPMStreamingDetokenizer,
        TokenizerWrapper,
    )
    from transformers import PreTrainedTokenizerFast

    from .spm import sentencepiece

    kind = md.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise ValueError(
            f"GGUF tokenizer model '{kind}' is not supported (byte-level BPE, "
            "'gpt2', and SentencePiece, 'llama', are); load the safetensors version "
            "of the model."
        )
    tokens = md["tokenizer.ggml.tokens"]

    def special(key):
        i = md.get(f"tokenizer.ggml.{key}_token_id")
        return (
            (i, tokens[i]) if i is not None and 0 <= i < len(tokens) else (None, None)
        )

    if kind == "gpt2":
        tok, detokenizer = _bpe(md, tokens), BPEStreamingDetokenizer
    else:
        tok = sentencepiece(md, tokens)  # no dummy prefix to trim when decoding
        detokenizer = partial(SPMStreamingDetokenizer, trim_space=False)
    bos_id, bos = special("bos")
    add_bos = md.get("tokenizer.ggml.add_bos_token", kind == "llama")  # llama.cpp's
    if add_bos and bos is not None:
        from tokenizers import processors

        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, bos_id)],
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=special("eos")[1],
        unk_token=special("unknown")[1],
        pad_token=special("padding")[1],
    )
    fast.chat_template = md.get("tokenizer.chat_template")
    eos_ids = [special(k)[0] for k in ("eos", "eot", "eom")]
    return TokenizerWrapper(
        fast,
        detokenizer,
        eos_token_ids=[i for i in eos_ids if i is not None],
    )


def _bpe(md: dict, tokens: list):
    """Byte-level BPE with the file's merges, pre-tokenizer and added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    merges = [tuple(m.split(" ", 1)) for m in md.get("tokenizer.ggml.merges", [])]
    types = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    pre = md.get("tokenizer.ggml.pre", "default")
    tok = Tokenizer(
        models.BPE(
            {t: i for i, t in enumerate(tokens)},
            merges,
            ignore_merges=pre in _IGNORE_MERGES,
        )
    )
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens(
        [
            AddedToken(tokens[i], special=t == CONTROL, normalized=False)
            for i, t in enumerate(types)
            if t in (CONTROL, USER_DEFINED)
        ]
    )
    return tok


def _pre_tokenizer(pre: str):
    """llama.cpp's pre-tokenizer `pre` (tokenizer.ggml.pre) as a tokenizers one."""
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(
        add_prefix_space=False, use_regex=pre not in _SPLITS
    )
    if pre in _SPLITS:
        split = pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated")
        return pre_tokenizers.Sequence([split, byte_level])
    if pre == "smollm":
        digits = pre_tokenizers.Digits(individual_digits=True)
        return pre_tokenizers.Sequence([digits, byte_level])
    return byte_level
