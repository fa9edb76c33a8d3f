"""Chat prompts as a model expects them: its chat template (with the thinking switch
where the template has one), and token-exact encoding that keeps earlier answers' ids.

Stateless, for any caller that keeps its own history (the chat session, a server):
render a message list, then encode it against the last exchange so that the ids of an
answer stay the ones that were generated (re-tokenizing the text can split it
differently, and the prompt cache would then miss from that point on).

No forged roles: text in system, user and tool messages that spells one of the
tokenizer's special tokens (`<|im_end|>`, `<|im_start|>`, ...) is encoded as plain
text, never as that control token; only the template's own markup becomes control
tokens. `render_messages` marks where such text landed in the rendered prompt (a
`Prompt`), and `encode` encodes those spans with special tokens split.
"""

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def chat_template(tokenizer) -> str:
    """The tokenizer's chat template, '' when it has none."""
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) else ""


def supports_thinking(tokenizer) -> bool:
    """Whether the chat template takes `enable_thinking`."""
    return "enable_thinking" in chat_template(tokenizer)


# Roles whose text must never become control tokens (the assistant's own turns, sent
# back by the client, are rendered as the template does).
LITERAL_ROLES = ("system", "developer", "user", "tool")


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: its text, and the (start, end) spans of it that came from
    message text and spell special tokens (encoded as plain text)."""

    text: str
    literal: tuple[tuple[int, int], ...] = ()


def render(
    tokenizer,
    messages: list[dict],
    *,
    system: str | None = None,
    thinking: bool | None = None,
    raw: bool = False,
    **template_kwargs,
) -> str:
    """The prompt text for `messages` (after `system`), ending where the answer starts.

    `thinking` sets `enable_thinking` where the template has it (None: its default);
    `raw` joins the contents as they are; a tokenizer without a template gets
    "Role: content" paragraphs. Other keywords (e.g. `tools`) go to the template.
    """
    prompt = render_prompt(
        tokenizer,
        messages,
        system=system,
        thinking=thinking,
        raw=raw,
        **template_kwargs,
    )
    return prompt.text


def render_prompt(
    tokenizer,
    messages: list[dict],
    *,
    system: str | None = None,
    thinking: bool | None = None,
    raw: bool = False,
    **template_kwargs,
) -> Prompt:
    """`render`, keeping where special-token text from messages landed (for `encode`).
    A `raw` prompt stays raw: its special-token text is encoded as special tokens."""
    conversation = [{"role": "system", "content": system}] if system else []
    conversation += messages
    if raw:
        return Prompt("\n\n".join(m["content"] for m in conversation))
    template = chat_template(tokenizer)
    if not template:
        return render_messages(tokenizer, conversation, _paragraphs)
    if thinking is not None and "enable_thinking" in template:
        template_kwargs["enable_thinking"] = thinking

    def apply(conversation: list[dict]) -> str:
        return tokenizer.apply_chat_template(
            conversation, add_generation_prompt=True, tokenize=False, **template_kwargs
        )

    return render_messages(tokenizer, conversation, apply)


def _paragraphs(conversation: list[dict]) -> str:
    """A prompt for a tokenizer without a chat template: "Role: content" paragraphs."""
    turns = "".join(
        f"{m['role'].capitalize()}: {m['content']}\n\n" for m in conversation
    )
    return turns + "Assistant:"


def special_texts(tokenizer) -> list[str]:
    """The strings the tokenizer encodes as special (control) tokens, longest first."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {t.content for t in decoder.values() if getattr(t, "special", False)}
    found.update(getattr(tokenizer, "all_special_tokens", None) or ())
    return sorted((t for t in found if isinstance(t, str) and t), key=len, reverse=True)


_SENTINELS = [("\ue000", "\ue001"), ("\U000f0000", "\U000f0001")]


def render_messages(
    tokenizer, messages: list[dict], render: Callable[[list[dict]], str]
) -> Prompt:
    """`render(messages)` (a chat template, say), with every piece of special-token
    text in a system, user or tool message's content marked literal in the result.

    Each such piece goes through `render` as a placeholder the template copies like any
    text, and is put back afterwards: the template sees the same messages otherwise,
    and only its own markup stays markup.
    """
    specials = special_texts(tokenizer)
    found = [_special_spans(tokenizer, m, specials) for m in messages]
    if not any(found):
        return Prompt(render(messages))
    texts = "".join(str(m.get("content")) for m in messages)
    marks = next(
        ((a, b) for a, b in _SENTINELS if a not in texts and b not in texts), None
    )
    if marks is None:
        raise ValueError(
            "A message holds both U+E000 and U+F0000 private-use characters along with "
            "special-token text: remove one of them."
        )
    table: list[str] = []
    escaped = [
        {**m, "content": _hide(m["content"], spans, table, marks)} if spans else m
        for m, spans in zip(messages, found, strict=True)
    ]
    return _restore(render(escaped), table, marks)


def _special_spans(tokenizer, message: dict, specials: list[str]) -> list:
    """Where a system, user or tool message's text spells special tokens, found as the
    tokenizer finds them (its own matcher, linear in the text)."""
    text = message.get("content")
    if message.get("role") not in LITERAL_ROLES or not isinstance(text, str):
        return []
    if not any(p in text for p in {t[:2] for t in specials}):  # most text: no
        return []
    hf = _hf(tokenizer)
    if getattr(hf, "is_fast", False):
        decoder = hf.added_tokens_decoder
        ids = {i for i, t in decoder.items() if t.special} | set(hf.all_special_ids)
        got = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        pairs = zip(got["input_ids"], got["offset_mapping"], strict=True)
        return [(a, b) for i, (a, b) in pairs if i in ids and b > a]
    pattern = re.compile("|".join(re.escape(t) for t in specials))
    return [m.span() for m in pattern.finditer(text)]


def _hide(text: str, spans: list, table: list[str], marks: tuple[str, str]) -> str:
    """`text` with each span replaced by a numbered placeholder (kept in `table`)."""
    out, pos = [], 0
    for a, b in spans:
        out += [text[pos:a], f"{marks[0]}{len(table)}{marks[1]}"]
        table.append(text[a:b])
        pos = b
    return "".join(out) + text[pos:]


def _restore(text: str, table: list[str], marks: tuple[str, str]) -> Prompt:
    """Placeholders back to their special-token text, each span marked literal."""
    pattern = re.compile(f"{re.escape(marks[0])}(\\d+){re.escape(marks[1])}")
    out, spans, pos, length = [], [], 0, 0
    for match in pattern.finditer(text):
        out.append(text[pos : match.start()])
        length += match.start() - pos
        piece = table[int(match.group(1))]
        out.append(piece)
        spans.append((length, length + len(piece)))
        length += len(piece)
        pos = match.end()
    out.append(text[pos:])
    return Prompt("".join(out), tuple(spans))


def opens_thinking(prompt_text: str) -> bool:
    """Whether the prompt leaves a <think> block open: the answer starts inside it."""
    return prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE)


@dataclass(frozen=True)
class Exchange:
    """A prompt and the answer generated after it: the text the template will render
    again for them, and the exact ids the caches hold for that text."""

    text: str
    ids: list[int]


def encode(
    tokenizer,
    prompt: str | Prompt,
    previous: Exchange | None = None,
    *,
    special: bool = False,
) -> list[int]:
    """Ids of `prompt`; when it continues `previous` (the template rendered the last
    answer verbatim) they start with `previous.ids`, and only the rest is encoded.

    A `Prompt`'s literal spans are encoded with special tokens split (as plain text).
    `special` adds the tokenizer's special tokens (a BOS): templates write their own.
    """
    text, literal = (
        (prompt.text, prompt.literal) if isinstance(prompt, Prompt) else (prompt, ())
    )
    if previous is not None and text.startswith(previous.text):
        cut = len(previous.text)
        spans = [(a - cut, b - cut) for a, b in literal if a >= cut]
        rest = text[cut:]
        return previous.ids + (_encode(tokenizer, rest, spans, False) if rest else [])
    return _encode(tokenizer, text, list(literal), special)


def _encode(tokenizer, text: str, spans: list, special: bool) -> list[int]:
    """`text` to ids, the `spans` of it as plain text (special tokens split)."""
    if not spans:
        return tokenizer.encode(text, add_special_tokens=special)
    pieces, pos = [], 0
    for a, b in spans:
        pieces += [(text[pos:a], False), (text[a:b], True)]
        pos = b
    pieces = [p for p in pieces + [(text[pos:], False)] if p[0]]
    ids = tokenizer.encode(pieces[0][0], add_special_tokens=special) if special else []
    rest = pieces[1:] if special else pieces
    hf = _hf(tokenizer)
    encoded: dict[bool, Iterator] = {}
    for plain in (False, True):  # one batch per kind (a long prompt has many spans)
        batch = [p for p, kind in rest if kind is plain]
        options = {"split_special_tokens": True} if plain else {}
        out = hf(batch, add_special_tokens=False, **options) if batch else {}
        encoded[plain] = iter(out.get("input_ids", []))
    for _, plain in rest:
        ids += list(next(encoded[plain]))
    return ids


def _hf(tokenizer) -> Any:
    """The Hugging Face tokenizer itself (mlx-lm's wrapper holds it)."""
    inner = getattr(tokenizer, "_tokenizer", None)
    return inner if hasattr(inner, "added_tokens_decoder") else tokenizer


def split_thinking(text: str) -> tuple[str, str]:
    """(thinking, answer) of an assistant message; thinking is '' when there is none."""
    if THINK_CLOSE not in text:
        if THINK_OPEN in text:
            return text.split(THINK_OPEN, 1)[1].strip(), ""
        return "", text.strip()
    head, answer = text.split(THINK_CLOSE, 1)
    return head.replace(THINK_OPEN, "").strip(), answer.strip()
