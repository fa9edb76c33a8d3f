"""Structured output: a grammar (a JSON schema, Lark, a regex) as a logits processor
that masks the target's logits to the tokens the grammar allows, through llguidance
(the optional extra `structured`).

The processor is mlx-lm's `(tokens, logits) -> logits`; under speculation the engine
calls it at every verified position with the history up to it (engine/processors.py),
so a draft the grammar forbids is rejected like any other and the output is plain
constrained decoding's. The processor follows the history it is shown: it advances its
matcher over new tokens and rolls it back past drafts that were not kept.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import mlx.core as mx

INSTALL = (
    "Structured output (JSON schemas, grammars, tool_choice) needs llguidance: "
    "pip install 'mlx-dflash[structured]'."
)
# the finish reason of an answer whose grammar allowed no token (see GrammarProcessor)
DEAD_END = "grammar"


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise ValueError(INSTALL) from None
    return llguidance


class Grammars:
    """Grammars for one tokenizer and vocabulary: builds the matcher's view of the
    vocabulary once (about a second on a large one) and makes a fresh processor per
    generation. `tokenizer`: a transformers fast tokenizer or mlx-lm's wrapper of
    one; `vocab_size`: the width of the target's logits."""

    def __init__(self, tokenizer, vocab_size: int):
        llg = _llguidance()
        hf = getattr(tokenizer, "_tokenizer", tokenizer)
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise ValueError(
                "Structured output needs a fast (Rust) Hugging Face tokenizer; this "
                f"model's is {type(hf).__name__}."
            )
        eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [hf.eos_token_id])
        self.eos = tuple(int(e) for e in eos)
        self.vocab_size = int(vocab_size)
        self.tokenizer = llg.LLTokenizer(
            backend.to_str(), n_vocab=self.vocab_size, eos_token=list(self.eos)
        )

    def grammar(self, spec: "GrammarSpec") -> str:
        """The llguidance grammar for `spec`; a ValueError naming what is wrong."""
        llg = _llguidance()
        try:
            if spec.kind == "json_schema":
                grammar = llg.LLMatcher.grammar_from_json_schema(
                    spec.source, defaults={"whitespace_flexible": False}
                )
            elif spec.kind == "lark":
                grammar = llg.LLMatcher.grammar_from_lark(spec.source)
            elif spec.kind == "regex":
                grammar = llg.LLMatcher.grammar_from_regex(spec.source)
            else:
                raise ValueError(f"unknown grammar kind {spec.kind!r}")
        except ValueError as e:
            raise ValueError(f"The {spec.name} is not valid: {e}") from None
        error = llg.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error and not error.startswith("WARNING"):
            raise ValueError(f"The {spec.name} is not valid: {error}")
        return grammar

    def processor(self, spec: "GrammarSpec") -> "GrammarProcessor":
        """A fresh processor for one generation (it keeps that generation's state)."""
        llg = _llguidance()
        matcher = llg.LLMatcher(self.tokenizer, self.grammar(spec))
        if matcher.is_error():
            raise ValueError(f"The {spec.name} is not valid: {matcher.get_error()}")
        return GrammarProcessor(matcher, self.eos, self.vocab_size, self.tokenizer)


@dataclass(frozen=True)
class GrammarSpec:
    """What the output must match: `kind` "json_schema" (source: a schema, a dict or
    JSON text), "lark" or "regex" (source: text)."""

    kind: str
    source: object
    name: str = "grammar"  # for messages: "JSON schema", "response_format", ...

    @classmethod
    def json_schema(cls, schema, name: str = "JSON schema") -> "GrammarSpec":
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"The {name} is not valid JSON: {e}") from None
        if not isinstance(schema, dict):
            raise ValueError(f"The {name} must be a JSON object, got {schema!r:.60}.")
        return cls("json_schema", schema, name)

    @classmethod
    def json_object(cls) -> "GrammarSpec":
        """Any JSON object (OpenAI's response_format json_object)."""
        return cls("json_schema", {"type": "object"}, "JSON object")


class GrammarProcessor:
    """A grammar's mask as a logits processor for one generation.

    The first call's history is the prompt; the tokens after it are the answer, which
    the matcher follows: each call rolls it back to where that history and the tokens
    it consumed agree, then consumes the rest. A row after a token the grammar forbids
    is returned as it is (the engine rejects that token before reading the row). When
    the grammar allows no token (a dead end) only the stop tokens are left and
    `dead_end` is set: the answer ends there, never runs on."""

    def __init__(self, matcher, eos: tuple[int, ...], vocab_size: int, tokenizer=None):
        self.matcher, self.eos, self.vocab_size = matcher, eos, vocab_size
        self.tokenizer = tokenizer  # llguidance's, for `propose`'s guesses
        self.start: int | None = None  # the prompt's length
        self.consumed: list[int] = []  # the answer's tokens the matcher is past
        self.dead_end = False
        # data, not a lazy graph: made on a server's request thread, used on its
        # engine thread
        self._shifts = mx.array(list(range(32)), mx.uint32)

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self.start is None:
            self.start = tokens.shape[0]
        answer = tokens[self.start :].tolist() if tokens.shape[0] > self.start else []
        if not self._follow(cast(list, answer)):
            return logits  # a forbidden token before this position: never read
        allowed = self._allowed()
        if allowed is None:
            self.dead_end = True
            allowed = mx.zeros((self.vocab_size,), mx.bool_)
            allowed = allowed.at[mx.array(self.eos)].add(True)
        width = logits.shape[-1]
        if width != self.vocab_size:  # the matcher covers what the tokenizer has
            allowed = mx.pad(allowed[:width], (0, max(0, width - allowed.shape[0])))
        return mx.where(allowed, logits, mx.array(-mx.inf, logits.dtype))

    def propose(
        self, ids: Sequence[int], last: int, drafts: list[int]
    ) -> tuple[list[int], list[bool]]:
        """The drafts to verify after `ids` and `last`, and for each one the grammar
        allows whether the grammar chose it. Where it leaves one way on (a key, the
        punctuation around it) that way's tokens replace the drafts: the target, masked,
        can only accept them; where it forces bytes but not their tokens, the canonical
        tokenization is the guess. From the first draft it forbids on, the drafts are
        left as they are (they would be rejected). Each choice reads only the tokens
        before it, so a proposal stays a function of its prefix."""
        if self.start is None or not self._follow([*ids[self.start :], last]):
            return drafts, []
        matcher, out, chosen = self.matcher, [], []
        for draft in drafts:
            if matcher.is_stopped() or matcher.is_error():
                break
            forced = self._forced()
            token = draft if forced is None else forced
            if not matcher.validate_tokens([token]) or not matcher.consume_token(token):
                break
            out.append(token)
            chosen.append(forced is not None)
        if out:
            matcher.rollback(len(out))
        return out + drafts[len(out) :], chosen

    def _forced(self) -> int | None:
        """The token the grammar forces next, or the canonical first token of the bytes
        it forces; None where it forces nothing."""
        forced = self.matcher.compute_ff_tokens()
        if forced:
            return forced[0]
        data = self.matcher.compute_ff_bytes() if self.tokenizer is not None else b""
        guess = self.tokenizer.tokenize_bytes(data) if data else []
        return guess[0] if guess else None

    def _follow(self, answer: list) -> bool:
        """Move the matcher to `answer`; False where it holds a forbidden token."""
        consumed, k = self.consumed, 0
        while k < min(len(answer), len(consumed)) and answer[k] == consumed[k]:
            k += 1
        if k < len(consumed):
            self.matcher.rollback(len(consumed) - k)
            del consumed[k:]
        new = answer[k:]
        if not new:
            return True
        n = self.matcher.validate_tokens(new)
        if n and self.matcher.consume_tokens(new[:n]):
            consumed.extend(new[:n])
        return n == len(new)

    def _allowed(self) -> mx.array | None:
        """The allowed tokens (vocab,) as booleans; None when there are none."""
        if self.matcher.is_error():
            return None
        mask = self.matcher.compute_bitmask()
        if not mask.strip(b"\x00"):
            return None
        words = mx.array(cast(list, memoryview(mask).cast("I")))  # no copy to a list
        bits = (words[:, None] >> self._shifts) & 1
        return bits.reshape(-1)[: self.vocab_size].astype(mx.bool_)
