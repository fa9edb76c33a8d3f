"""Requests to prompt token ids: chat messages through the model's own chat template
(tools and the thinking switch included), raw completion prompts as they are."""

import json
import logging
from typing import NamedTuple

from .errors import ApiError

log = logging.getLogger("dflash_mlx.serve")


TEXT_PARTS = ("text", "input_text", "output_text")


def _part(part) -> tuple[str | None, str | None]:
    """(type, text) of a content part, a dict or a parsed block."""
    if isinstance(part, dict):
        return part.get("type"), part.get("text")
    return getattr(part, "type", None), getattr(part, "text", None)


def message_text(content, where: str) -> str:
    """A message's content as one string (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind, text = _part(part)
        if kind not in TEXT_PARTS or not isinstance(text, str):
            raise ApiError(
                400,
                f"{where}[{j}] is a '{kind}' part: this server runs a text model, "
                "send text parts only.",
                param=f"{where}[{j}]",
            )
        texts.append(text)
    return "".join(texts)


def tool_output_text(content) -> str:
    """A tool result as text. The client, not the user, chose its parts, so a part
    a text model cannot read (an image) becomes a note instead of an error."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        kind, text = _part(part)
        if kind not in TEXT_PARTS or not isinstance(text, str):
            text = f"[{kind} omitted: this model reads text only]"
        texts.append(text)
    return "".join(texts)


def _arguments(args, where: str):
    if isinstance(args, dict):
        return args
    try:
        return json.loads(args) if args.strip() else {}
    except json.JSONDecodeError:
        raise ApiError(
            400,
            f"{where} is not valid JSON: send the arguments as a JSON object string.",
            param=where,
        ) from None


def chat_messages(messages) -> list[dict]:
    """OpenAI chat messages as the dicts chat templates expect."""
    out = []
    for i, m in enumerate(messages):
        text = (
            tool_output_text(m.content)
            if m.role == "tool"
            else message_text(m.content, f"messages[{i}].content")
        )
        msg = {"role": "system" if m.role == "developer" else m.role, "content": text}
        if m.name:
            msg["name"] = m.name
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        if m.reasoning_content:
            msg["reasoning_content"] = m.reasoning_content
        if m.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        "arguments": _arguments(
                            c.function.arguments,
                            f"messages[{i}].tool_calls[{j}].function.arguments",
                        ),
                    },
                }
                for j, c in enumerate(m.tool_calls)
            ]
        out.append(msg)
    return out


# arguments of apply_chat_template that the server sets itself
_RESERVED = {
    "tokenize",
    "add_generation_prompt",
    "return_dict",
    "tools",
    "chat_template",
}


class ChatPrompt(NamedTuple):
    """A chat request's prompt: its ids, the state the answer starts in ("normal" or
    "reasoning"), its text, and where its system part ends (tokens; 0: none)."""

    ids: list[int]
    state: str
    text: str = ""
    boundary: int = 0


def render_chat(
    tokenizer, messages: list[dict], tools=None, template_kwargs=None, history=None
) -> ChatPrompt:
    """The prompt of a chat request; with `history` (serve/history.py), the ids of
    resent answers are the ones they were generated with."""
    clash = sorted(_RESERVED & set(template_kwargs or {}))
    if clash:
        raise ApiError(
            400,
            f"chat_template_kwargs cannot set {', '.join(clash)}: the server sets it.",
            param="chat_template_kwargs",
        )
    from ..conversation import encode, render_messages, render_prompt

    if not getattr(tokenizer, "has_chat_template", False):
        prompt = render_prompt(tokenizer, messages)  # "Role: content", as the chat
        return ChatPrompt(encode(tokenizer, prompt, special=True), "normal")

    def apply(msgs):
        return tokenizer.apply_chat_template(
            msgs,
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=False,
            **(template_kwargs or {}),
        )

    try:  # message text that spells special tokens stays text: no forged roles
        prompt = render_messages(
            tokenizer, messages, lambda m: place_system_messages(m, apply)
        )
    except Exception as e:  # jinja raises its own errors for messages it rejects
        raise ApiError(
            400,
            f"The model's chat template rejected these messages ({e}): check the roles "
            "and their order.",
            param="messages",
        ) from None
    text = prompt.text
    ids = encode(tokenizer, prompt, history.find(text) if history else None)
    state = "normal"
    if tokenizer.has_thinking and text.rfind(tokenizer.think_start) > text.rfind(
        tokenizer.think_end
    ):
        state = "reasoning"  # the template opened a thinking block for the answer
    boundary = _system_end(tokenizer, messages, tools, template_kwargs, ids)
    return ChatPrompt(ids, state, text, boundary)


def _system_end(tokenizer, messages: list[dict], tools, kwargs, ids: list[int]) -> int:
    """Tokens of the prompt's system part (its system messages, and the tools a
    template writes with them) when the prompt starts with it alone; else 0. The
    prefix cache keeps a recurrent model's state there, so another conversation with
    the same system part starts from it."""
    from ..conversation import encode

    head = []
    for m in messages:
        if m.get("role") != "system":
            break
        head.append(m)
    if not head:
        return 0
    try:
        text = tokenizer.apply_chat_template(
            head, tools=tools or None, add_generation_prompt=False, tokenize=False,
            **(kwargs or {}),
        )  # fmt: skip
    except Exception:  # a template that wants a user turn: no boundary
        return 0
    part = encode(tokenizer, text)
    return len(part) if 0 < len(part) < len(ids) and ids[: len(part)] == part else 0


def completion_prompt(tokenizer, prompt, vocab_size: int) -> list[int]:
    """A raw completion prompt (text, one text in a list, or token ids) as ids."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise ApiError(
                400,
                "'prompt' holds several prompts: send one per request.",
                param="prompt",
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        from ..generate import encode_prompt

        return encode_prompt(tokenizer, prompt)
    if any(not 0 <= t < vocab_size for t in prompt):
        raise ApiError(
            400, f"'prompt' token ids must be in 0..{vocab_size - 1}.", param="prompt"
        )
    return list(prompt)


def skip_tools(kinds) -> None:
    """One log line for the built-in tools (web search, computer use...) a request
    declares: the model cannot run them, so they are left out, not refused."""
    kinds = sorted({str(k) for k in kinds})
    if kinds:
        log.warning("ignoring tools this server cannot run: %s", ", ".join(kinds))


def tool_specs(tools) -> list[dict] | None:
    """OpenAI function tools as the dicts chat templates render."""
    functions = [t for t in tools or [] if t.type == "function" and t.function]
    skip_tools(t.type for t in tools or [] if t not in functions)
    return [t.model_dump(exclude_none=True) for t in functions] or None


def place_system_messages(messages: list[dict], apply) -> str:
    """The rendered prompt, with system messages where the chat template takes them.

    Agents send system messages mid-conversation (Claude Code's reminders, a late
    OpenAI `developer` message). Rendered in place when `apply` (the chat template)
    accepts them and keeps their text; otherwise all system messages are folded, in
    order, into one leading system prompt (templates that raise on a late system
    message, or drop it)."""
    systems = [i for i, m in enumerate(messages) if m["role"] == "system"]
    if not systems or systems == [0]:
        return apply(messages)
    try:
        text = apply(messages)
        if all(messages[i]["content"].strip() in text for i in systems):
            return text
    except Exception:  # e.g. "System message must be at the beginning."
        pass
    folded = "\n\n".join(messages[i]["content"] for i in systems)
    rest = [m for m in messages if m["role"] != "system"]
    return apply([{"role": "system", "content": folded}, *rest])
