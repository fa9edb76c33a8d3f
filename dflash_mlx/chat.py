"""A chat session without a terminal: history, chat template, prompt-cache reuse across
turns, slash-command state and transcripts. The CLI (`dflash-mlx chat`) only draws it."""

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

from .adaptive import AdaptiveBlockSize
from .generate import GenerationResponse, make_prompt_cache, stream_generate

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

COMMANDS = {
    "/help": "show this help",
    "/reset": "forget the conversation (and its caches)",
    "/stats": "session statistics",
    "/temp X": "set the sampling temperature (0 = greedy)",
    "/block N": "set the verify block size (1 = plain decoding)",
    "/max N": "set the maximum tokens per answer (-1: up to the context)",
    "/draft on|off": "speculative decoding on, or plain decoding to compare",
    "/color on|off": "colour tokens by source (drafted vs target)",
    "/save PATH": "save the transcript (.json, otherwise Markdown)",
    "/exit": "leave (also Ctrl-D)",
}


def resolve_models(model: str | None, draft: str | None, no_draft: bool = False):
    """(target, drafter or None, note or None) from CLI options, the defaults and the registry."""
    if model is None:
        try:
            from .defaults import default_draft, default_target
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.defaults":
                raise
            raise ValueError(
                "No built-in default model yet: pass --model <folder or Hub id> "
                "(and --draft <drafter> for speculative decoding)."
            ) from None
        model = default_target()
        if draft is None and not no_draft:
            draft = default_draft()
    if no_draft:
        return model, None, "plain decoding (--no-draft)"
    if draft is None:
        try:
            from .registry import drafter_for
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.registry":
                raise
            drafter_for = None
        draft = drafter_for(model) if drafter_for is not None else None
        if draft is None:
            return model, None, "no drafter: plain decoding; pass --draft"
    return model, draft, None


def context_length(model) -> int | None:
    """The target's context window from its config, when it declares one."""
    args = getattr(model, "args", None)
    for src in (args, getattr(args, "text_config", None)):
        if isinstance(src, dict):
            value = src.get("max_position_embeddings")
        else:
            value = getattr(src, "max_position_embeddings", None)
        if value:
            return int(value)
    return None


class Piece(NamedTuple):
    """Text of one committed token, with where it came from."""

    text: str
    drafted: bool  # proposed by the drafter and accepted (else sampled by the target)
    thinking: bool  # inside <think>...</think>


@dataclass
class Settings:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 1024
    block_size: int | str | None = None  # None or "auto": adaptive; an int: fixed
    draft_on: bool = True
    color: bool = False


@dataclass
class TurnStats:
    """Numbers for one answer (the summary line and /stats)."""

    mode: str  # "dflash" or "plain"
    block_size: int | str
    prompt_tokens: int = 0
    reused_tokens: int = 0
    prompt_tps: float = 0.0
    generation_tokens: int = 0
    generation_tps: float = 0.0
    ttft: float = 0.0  # seconds from the request to the first token
    elapsed: float = 0.0  # seconds since the request
    blocks: int = 0  # verified blocks after the first token
    accepted: int = 0  # tokens those blocks committed
    last_accepted: int | None = None
    drafted: int = 0  # committed tokens that came from the drafter
    peak_memory: float = 0.0
    finish_reason: str | None = None  # "stop", "length" or "interrupted"
    speedup: float | None = None  # vs the plain tok/s measured in this session

    @property
    def mean_accepted(self) -> float | None:
        return self.accepted / self.blocks if self.blocks else None

    def add(self, r: GenerationResponse, elapsed: float):
        if r.accepted is None:
            self.ttft = elapsed
            self.prompt_tokens, self.reused_tokens = r.prompt_tokens, r.reused_tokens
            self.prompt_tps = r.prompt_tps
        else:
            self.blocks += 1
            self.accepted += r.accepted
            self.last_accepted = r.accepted
        self.drafted += r.from_draft
        self.generation_tokens, self.generation_tps = (
            r.generation_tokens,
            r.generation_tps,
        )
        self.peak_memory, self.elapsed = r.peak_memory, elapsed


@dataclass
class Chunk:
    """One verified block as the UI needs it."""

    response: GenerationResponse
    pieces: list[Piece]
    stats: TurnStats

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.pieces)


class _Splitter:
    """Per-token text (its own streaming detokenizer) and <think> tracking."""

    def __init__(self, tokenizer, thinking: bool):
        self.detokenizer = tokenizer.detokenizer
        self.thinking = thinking

    def split(self, r: GenerationResponse) -> list[Piece]:
        tokens = r.tokens[:-1] if r.finish_reason == "stop" else r.tokens
        texts = []
        for t in tokens:
            self.detokenizer.add_token(t)
            texts.append(self.detokenizer.last_segment)
        if r.finish_reason is not None:
            self.detokenizer.finalize()
            tail = self.detokenizer.last_segment
            if texts:
                texts[-1] += tail
            elif tail:
                texts.append(tail)
        pieces = []
        for i, text in enumerate(texts):
            drafted = i < r.from_draft
            while text:
                tag = THINK_CLOSE if self.thinking else THINK_OPEN
                at = text.find(tag)
                if at < 0:
                    pieces.append(Piece(text, drafted, self.thinking))
                    break
                head, text = text[: at + len(tag)], text[at + len(tag) :]
                pieces.append(Piece(head, drafted, True))
                self.thinking = not self.thinking
        return pieces


def split_thinking(text: str) -> tuple[str, str]:
    """(thinking, answer) of an assistant message; thinking is '' when there is none."""
    if THINK_CLOSE not in text:
        if THINK_OPEN in text:
            return text.split(THINK_OPEN, 1)[1].strip(), ""
        return "", text.strip()
    head, answer = text.split(THINK_CLOSE, 1)
    return head.replace(THINK_OPEN, "").strip(), answer.strip()


class ChatSession:
    """A conversation with a target (and optional drafter) that keeps its caches across turns."""

    def __init__(
        self,
        model,
        tokenizer,
        draft=None,
        *,
        system: str | None = None,
        thinking: bool | None = None,
        settings: Settings | None = None,
        reuse_cache: bool = True,
        raw: bool = False,
        names: dict | None = None,
    ):
        from .generate import _wrap_tokenizer

        self.model, self.draft = model, draft
        self.tokenizer = _wrap_tokenizer(tokenizer)
        self.system, self.thinking = system, thinking
        self.settings = settings or Settings()
        self.reuse_cache = reuse_cache
        self.raw = raw  # no chat template: the prompt is the messages' text as-is
        self.names = names or {}
        self.context = context_length(model)
        self.messages: list[dict] = []
        self.turns: list[TurnStats] = []
        self.cache = make_prompt_cache(model, draft)
        self._sent: tuple[str, list[int]] | None = (
            None  # (text, ids) of the last exchange
        )
        self._adaptive: AdaptiveBlockSize | None = None

    # -- template -------------------------------------------------------------------------
    @property
    def template(self) -> str:
        t = getattr(self.tokenizer, "chat_template", None)
        return t if isinstance(t, str) else ""

    @property
    def thinking_supported(self) -> bool:
        return "enable_thinking" in self.template

    def _conversation(self, messages: list[dict]) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + [{"role": m["role"], "content": m["content"]} for m in messages]

    def render_text(self, messages: list[dict] | None = None) -> str:
        """The prompt text for `messages` (default: the history) plus the assistant header."""
        conversation = self._conversation(
            self.messages if messages is None else messages
        )
        if self.raw:
            return "\n\n".join(m["content"] for m in conversation)
        if not self.template:
            return (
                "".join(
                    f"{m['role'].capitalize()}: {m['content']}\n\n"
                    for m in conversation
                )
                + "Assistant:"
            )
        kwargs = {}
        if self.thinking is not None and self.thinking_supported:
            kwargs["enable_thinking"] = self.thinking
        return self.tokenizer.apply_chat_template(
            conversation, add_generation_prompt=True, tokenize=False, **kwargs
        )

    def render(self, messages: list[dict] | None = None) -> list[int]:
        return self.encode(self.render_text(messages))

    # -- state ------------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return (
            "dflash"
            if self.draft is not None
            and self.settings.draft_on
            and self.block_size != 1
            else "plain"
        )

    @property
    def block_size(self) -> int | str:
        """The verify block size, or "auto" (chosen per block from measured speed)."""
        if self.draft is None or not self.settings.draft_on:
            return 1
        return self.settings.block_size or "auto"

    def _block_policy(self):
        # one adaptive policy per session, so what it learned carries over between turns
        if self.block_size != "auto":
            return self.block_size
        if self._adaptive is None:
            self._adaptive = AdaptiveBlockSize(self.draft.args.block_size)
        return self._adaptive

    @property
    def cached_tokens(self) -> int:
        return len(self.cache.tokens)

    def baseline_tps(self) -> float | None:
        """Mean plain-decoding tok/s measured in this session (needs a few tokens)."""
        plain = [
            t.generation_tps
            for t in self.turns
            if t.mode == "plain" and t.generation_tokens >= 8
        ]
        return sum(plain) / len(plain) if plain else None

    def encode(self, prompt_text: str) -> list[int]:
        """Prompt ids; the last exchange keeps its exact ids (the answer as generated, not
        re-tokenized) when the template renders it verbatim, so the cache matches it."""
        special = not self.template or self.raw
        if self._sent and prompt_text.startswith(self._sent[0]):
            rest = prompt_text[len(self._sent[0]) :]
            return self._sent[1] + (
                self.tokenizer.encode(rest, add_special_tokens=False) if rest else []
            )
        return self.tokenizer.encode(prompt_text, add_special_tokens=special)

    def reset(self):
        self.messages.clear()
        self._sent = None
        self.cache = make_prompt_cache(self.model, self.draft)

    def _cache_ok(self) -> bool:
        n = len(self.cache.tokens)
        offsets = [
            c.offset
            for c in self.cache.target + (self.cache.draft or [])
            if isinstance(getattr(c, "offset", None), int)
        ]
        return all(o == n for o in offsets)

    # -- a turn -----------------------------------------------------------------------------
    def stream(self, text: str) -> Iterator[Chunk]:
        """Answer `text`, one Chunk per verified block. Closing the iterator early (or a
        KeyboardInterrupt) keeps the partial answer in the history, marked interrupted.
        Raises ValueError at once (before any work) for an empty or too long prompt."""
        if not text.strip():
            raise ValueError("Empty message: type something (or /help).")
        user = {"role": "user", "content": text}
        prompt_text = self.render_text(self.messages + [user])
        ids = self.encode(prompt_text)
        max_tokens = self.settings.max_tokens
        if self.context:
            room = self.context - len(ids)
            if room <= 0:
                raise ValueError(
                    f"This prompt is {len(ids)} tokens but the model's context is "
                    f"{self.context}: /reset the conversation or send a shorter message."
                )
            max_tokens = room if max_tokens < 0 else min(max_tokens, room)
        thinking = prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE)
        return self._run(user, prompt_text, ids, max_tokens, thinking)

    def _run(
        self,
        user: dict,
        prompt_text: str,
        ids: list[int],
        max_tokens: int,
        thinking: bool,
    ) -> Iterator[Chunk]:
        s = self.settings
        if not self.reuse_cache:
            self.cache = make_prompt_cache(self.model, self.draft)
        self.messages.append(user)
        stats = TurnStats(self.mode, self.block_size)
        splitter = _Splitter(self.tokenizer, thinking)
        answer: list[str] = [THINK_OPEN + "\n"] if thinking else []
        generated: list[int] = []
        tic = time.perf_counter()
        gen = stream_generate(
            self.model,
            self.draft,
            self.tokenizer,
            ids,
            block_size=self._block_policy(),
            max_tokens=max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            prompt_cache=self.cache,
        )
        failed = False
        try:
            for r in gen:
                stats.add(r, time.perf_counter() - tic)
                chunk = Chunk(r, splitter.split(r), stats)
                answer.append(chunk.text)
                generated += r.tokens[:-1] if r.finish_reason == "stop" else r.tokens
                if r.finish_reason:
                    stats.finish_reason = r.finish_reason
                yield chunk
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            failed = not isinstance(e, GeneratorExit)
            raise
        finally:
            gen.close()
            if failed:  # an error: drop the turn, start the caches afresh
                self.messages.pop()
                self.cache = make_prompt_cache(self.model, self.draft)
                self._sent = None
            else:
                content = "".join(answer)
                self._finish(stats, content)
                self._sent = (
                    prompt_text + content[len(THINK_OPEN) + 1 :]
                    if thinking
                    else prompt_text + content,
                    ids + generated,
                )

    def _finish(self, stats: TurnStats, content: str):
        stats.elapsed = stats.elapsed or 0.0
        if stats.finish_reason is None:
            stats.finish_reason = "interrupted"
        base = self.baseline_tps()
        if stats.mode == "dflash" and base and stats.generation_tps:
            stats.speedup = stats.generation_tps / base
        self.turns.append(stats)
        message = {"role": "assistant", "content": content, "stats": asdict(stats)}
        if stats.finish_reason == "interrupted":
            message["interrupted"] = True
        self.messages.append(message)
        if not self._cache_ok():
            self.cache = make_prompt_cache(self.model, self.draft)

    # -- slash commands ---------------------------------------------------------------------
    def command(self, line: str) -> tuple[str, str]:
        """Apply a slash command: (action, message). Actions: help, stats, exit, info."""
        name, _, arg = line.strip().partition(" ")
        name, arg = name.lower(), arg.strip()
        s = self.settings
        if name in ("/exit", "/quit"):
            return "exit", ""
        if name == "/help":
            return "help", ""
        if name == "/stats":
            return "stats", ""
        if name == "/reset":
            self.reset()
            return "info", "Conversation and caches cleared."
        if name == "/temp":
            value = _number(arg, float, "/temp 0.7")
            if value < 0:
                raise ValueError(
                    "Temperature must be >= 0: /temp 0 for greedy, /temp 0.7 to sample."
                )
            s.temperature = value
            return "info", f"Temperature {value:g}" + (
                " (greedy)." if value == 0 else "."
            )
        if name == "/block":
            if arg == "auto":
                if self.draft is None:
                    raise ValueError(
                        "No drafter loaded: restart with --draft to use blocks."
                    )
                s.block_size = "auto"
                return "info", "Block size chosen per block from measured speed (auto)."
            value = _number(arg, int, "/block 16")
            if value < 1:
                raise ValueError(
                    "Block size must be >= 1: /block 16 (1 = plain decoding)."
                )
            if self.draft is None and value > 1:
                raise ValueError(
                    "No drafter loaded: restart with --draft to use blocks > 1."
                )
            s.block_size = value
            return "info", f"Block size {value}."
        if name == "/max":
            value = _number(arg, int, "/max 512")
            if value == 0 or value < -1:
                raise ValueError(
                    "Max tokens must be positive, or -1 for up to the context: /max 512"
                )
            s.max_tokens = value
            return "info", f"Max tokens {value}."
        if name == "/draft":
            if arg not in ("on", "off"):
                raise ValueError("Usage: /draft on  or  /draft off")
            if arg == "on" and self.draft is None:
                raise ValueError(
                    "No drafter loaded: restart with --draft <drafter> to use it."
                )
            s.draft_on = arg == "on"
            return "info", (
                "Speculative decoding on."
                if s.draft_on
                else "Plain decoding (the drafter's cache stays in sync for /draft on)."
            )
        if name == "/color":
            if arg not in ("on", "off"):
                raise ValueError("Usage: /color on  or  /color off")
            s.color = arg == "on"
            return "info", "Token colours " + arg + "."
        if name == "/save":
            if not arg:
                raise ValueError("Usage: /save chat.md  or  /save chat.json")
            path = self.save(arg)
            return "info", f"Saved {len(self.messages)} messages to {path}."
        raise ValueError(f"Unknown command {name}: /help lists the commands.")

    def stats(self) -> dict:
        """Session totals for /stats."""
        gen = sum(t.generation_tokens for t in self.turns)
        blocks = sum(t.blocks for t in self.turns if t.mode == "dflash")
        accepted = sum(t.accepted for t in self.turns if t.mode == "dflash")
        dflash = [
            t.generation_tps
            for t in self.turns
            if t.mode == "dflash" and t.generation_tokens
        ]
        return {
            "turns": len(self.turns),
            "generated_tokens": gen,
            "mean_acceptance": accepted / blocks if blocks else None,
            "dflash_tps": sum(dflash) / len(dflash) if dflash else None,
            "plain_tps": self.baseline_tps(),
            "cached_tokens": self.cached_tokens,
            "context": self.context,
            "mode": self.mode,
            "block_size": self.block_size,
            "temperature": self.settings.temperature,
            "last_ttft": self.turns[-1].ttft if self.turns else None,
            "peak_memory": max((t.peak_memory for t in self.turns), default=0.0),
        }

    # -- transcript ---------------------------------------------------------------------------
    def transcript(self) -> dict:
        messages = []
        if self.system:
            messages.append({"role": "system", "content": self.system})
        for m in self.messages:
            m = dict(m)
            if m["role"] == "assistant":
                m["thinking"], m["answer"] = split_thinking(m["content"])
            messages.append(m)
        return {
            "model": self.names.get("model"),
            "draft": self.names.get("draft"),
            "settings": asdict(self.settings),
            "messages": messages,
        }

    def save(self, path) -> Path:
        path = Path(path).expanduser()
        data = self.transcript()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix.lower() == ".json":
                path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
            else:
                path.write_text(_markdown(data))
        except OSError as e:
            raise ValueError(
                f"Cannot write {path} ({e.strerror}): choose another path."
            ) from e
        return path


def _number(arg: str, kind, example: str):
    try:
        return kind(arg)
    except ValueError:
        raise ValueError(f"Expected a number, e.g. {example}") from None


def _markdown(data: dict) -> str:
    lines = [f"# Chat with {data['model'] or 'the model'}", ""]
    if data["draft"]:
        lines += [f"Drafter: {data['draft']}", ""]
    for m in data["messages"]:
        lines += [f"## {m['role'].capitalize()}", ""]
        if m["role"] != "assistant":
            lines += [m["content"], ""]
            continue
        if m["thinking"]:
            lines += [
                "<details><summary>Thinking</summary>",
                "",
                m["thinking"],
                "",
                "</details>",
                "",
            ]
        lines += [m["answer"], ""]
        if m.get("interrupted"):
            lines += ["*[interrupted]*", ""]
        st = m.get("stats") or {}
        if st.get("generation_tokens"):
            tau = st["accepted"] / st["blocks"] if st.get("blocks") else None
            lines += [
                f"<sub>{st['generation_tokens']} tokens, {st['generation_tps']:.1f} tok/s, "
                f"{st['mode']}"
                + (f", τ {tau:.2f}" if tau and st["mode"] == "dflash" else "")
                + "</sub>",
                "",
            ]
    return "\n".join(lines)
