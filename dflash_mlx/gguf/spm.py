"""A SentencePiece BPE vocabulary (`tokenizer.ggml.model` "llama") as a tokenizers BPE.

The file keeps SentencePiece's pieces, scores and piece types, not merges. A piece is
made by merging two smaller pieces, so the merges are every split of a piece into two
pieces of the vocabulary, ranked as SentencePiece ranks pieces: by score, best first
(user-defined pieces, which llama.cpp stores with score -1000, rank as SentencePiece's
own score 0), then by the longer left part. On Gemma 3 this rebuilds the 514,906 merges
of Google's tokenizer.json exactly, in order (docs/gguf.md).

Text is normalized as Gemma's SentencePiece model does (spaces become "▁", no dummy
prefix), characters outside the vocabulary fall back to the `<0xNN>` byte pieces, and
control and user-defined pieces are matched whole before that. Vocabularies with a
dummy prefix (`tokenizer.ggml.add_space_prefix` true or absent: Llama 2, Mistral) are
refused: their prefix rules differ between tokenizer versions and no real file of
theirs is tested here. llama.cpp spells user-defined runs of spaces with real spaces;
they are spelled with "▁" again, as the vocabulary's other pieces are.
"""

NORMAL, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 3, 4, 5, 6
SPACE = "\u2581"


def _spelled(token: str) -> str:
    return SPACE * len(token) if token and not token.strip(" ") else token


def merges(tokens: list[str], scores: list[float], types: list[int]) -> list:
    """(left, right) pairs, highest priority first."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for i, piece in enumerate(tokens):
        if types[i] in (CONTROL, BYTE, UNUSED):
            continue
        score = 0.0 if types[i] == USER_DEFINED else float(scores[i])
        pairs = [
            (piece[:k], piece[k:])
            for k in range(1, len(piece))
            if piece[:k] in vocab and piece[k:] in vocab
        ]
        pairs.sort(key=lambda p: (vocab[p[0]], vocab[p[1]]))
        ranked += [(score, len(left), len(right), left, right) for left, right in pairs]
    ranked.sort(key=lambda r: r[:3], reverse=True)  # stable: ties keep vocab order
    return [(left, right) for *_, left, right in ranked]


def sentencepiece(md: dict, tokens: list[str]):
    """The tokenizers Tokenizer a SentencePiece GGUF vocabulary describes."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    if md.get("tokenizer.ggml.add_space_prefix", True):
        raise ValueError(
            "GGUF SentencePiece vocabularies with a space prefix (Llama 2, Mistral) "
            "are not rebuilt here (Gemma's, without one, is); load the safetensors "
            "version of the model."
        )
    tokens = [_spelled(t) for t in tokens]
    types = md.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    scores = md.get("tokenizer.ggml.scores") or [-float(i) for i in range(len(tokens))]
    unk = md.get("tokenizer.ggml.unknown_token_id")
    tok = Tokenizer(
        models.BPE(
            {t: i for i, t in enumerate(tokens)},
            merges(tokens, scores, types),
            unk_token=tokens[unk] if unk is not None else None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.add_tokens(
        [
            AddedToken(tokens[i], special=t == CONTROL, normalized=False)
            for i, t in enumerate(types)
            if t in (CONTROL, USER_DEFINED)
        ]
    )
    return tok
