"""Requests to prompt token ids: chat messages through the model's own chat template
(tools and the thinking switch included), raw completion prompts as they are."""

import json

from .errors import ApiError


def message_text(content, where: str) -> str:
    """A message's content as one string (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.type if hasattr(part, "type") else part.get("type")
        text = part.text if hasattr(part, "text") else part.get("text")
        if kind not in ("text", "input_text", "output_text") or text is None:
            raise ApiError(
                400,
                f"{where}[{j}] is a '{kind}' part: this server runs a text model, "
                "send text parts only.",
                param=f"{where}[{j}]",
            )
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
        msg = {
            "role": "system" if m.role == "developer" else m.role,
            "content": message_text(m.content, f"messages[{i}].content"),
        }
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


def render_chat(
    tokenizer, messages: list[dict], tools=None, template_kwargs=None
) -> tuple[list[int], str]:
    """(prompt ids, the state the answer starts in: "normal" or "reasoning")."""
    clash = sorted(_RESERVED & set(template_kwargs or {}))
    if clash:
        raise ApiError(
            400,
            f"chat_template_kwargs cannot set {', '.join(clash)}: the server sets it.",
            param="chat_template_kwargs",
        )
    if not getattr(tokenizer, "has_chat_template", False):
        from ..conversation import render  # "Role: content" paragraphs, as the chat

        return tokenizer.encode(render(tokenizer, messages)), "normal"
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=False,
            **(template_kwargs or {}),
        )
    except Exception as e:  # jinja raises its own errors for messages it rejects
        raise ApiError(
            400,
            f"The model's chat template rejected these messages ({e}): check the roles "
            "and their order.",
            param="messages",
        ) from None
    ids = tokenizer.encode(text, add_special_tokens=False)
    state = "normal"
    if tokenizer.has_thinking and text.rfind(tokenizer.think_start) > text.rfind(
        tokenizer.think_end
    ):
        state = "reasoning"  # the template opened a thinking block for the answer
    return ids, state


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


def tool_specs(tools) -> list[dict] | None:
    """OpenAI function tools as the dicts chat templates render."""
    if not tools:
        return None
    return [t.model_dump(exclude_none=True) for t in tools]
