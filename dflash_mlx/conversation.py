"""Chat prompts as a model expects them: its chat template (with the thinking switch
where the template has one), and token-exact encoding that keeps earlier answers' ids.

Stateless, for any caller that keeps its own history (the chat session, a server):
render a message list, then encode it against the last exchange so that the ids of an
answer stay the ones that were generated (re-tokenizing the text can split it
differently, and the prompt cache would then miss from that point on).
"""

from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def chat_template(tokenizer) -> str:
    """The tokenizer's chat template, '' when it has none."""
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) else ""


def supports_thinking(tokenizer) -> bool:
    """Whether the chat template takes `enable_thinking`."""
    return "enable_thinking" in chat_template(tokenizer)


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
    conversation = [{"role": "system", "content": system}] if system else []
    conversation += messages
    if raw:
        return "\n\n".join(m["content"] for m in conversation)
    template = chat_template(tokenizer)
    if not template:
        turns = "".join(
            f"{m['role'].capitalize()}: {m['content']}\n\n" for m in conversation
        )
        return turns + "Assistant:"
    if thinking is not None and "enable_thinking" in template:
        template_kwargs["enable_thinking"] = thinking
    return tokenizer.apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=False, **template_kwargs
    )


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
    prompt_text: str,
    previous: Exchange | None = None,
    *,
    special: bool = False,
) -> list[int]:
    """Ids of `prompt_text`; when it continues `previous` (the template rendered the
    last answer verbatim) they start with `previous.ids`, and only the rest is encoded.

    `special` adds the tokenizer's special tokens (a BOS): templates write their own.
    """
    if previous is not None and prompt_text.startswith(previous.text):
        rest = prompt_text[len(previous.text) :]
        new = tokenizer.encode(rest, add_special_tokens=False) if rest else []
        return previous.ids + new
    return tokenizer.encode(prompt_text, add_special_tokens=special)


def split_thinking(text: str) -> tuple[str, str]:
    """(thinking, answer) of an assistant message; thinking is '' when there is none."""
    if THINK_CLOSE not in text:
        if THINK_OPEN in text:
            return text.split(THINK_OPEN, 1)[1].strip(), ""
        return "", text.strip()
    head, answer = text.split(THINK_CLOSE, 1)
    return head.replace(THINK_OPEN, "").strip(), answer.strip()
