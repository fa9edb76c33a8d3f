"""`ChatSession`: the history, the caches kept across turns, and the settings the slash
commands change. Rendering, turns, commands and transcripts live in their own
modules."""

from collections.abc import Generator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import conversation, validate
from ..engine.lookup import LookupIndex
from ..engine.loop import as_target
from ..engine.policy import AdaptiveBlockSize
from ..generate import make_prompt_cache, stream_generate, wrap_tokenizer
from ..loading.resolve import context_length
from .commands import run_command
from .stats import TurnStats, baseline_tps, totals
from .transcript import save, transcript
from .turn import Chunk, Turn


@dataclass
class Settings:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 1024
    block_size: int | str | None = None  # None or "auto": adaptive; an int: fixed
    lookup: bool | None = None  # prompt lookup; None: with "auto" (generate's default)
    draft_on: bool = True
    color: bool = False
    markdown: bool = True  # answers rendered as Markdown (--plain: raw text)
    seed: int | None = None  # sampling seed; turn i draws with seed + i
    kv_bits: int | None = None  # the target's KV cache quantized (None: float)
    kv_group_size: int = 64
    grammar: object = None  # structured.GrammarSpec: every answer follows it

    def __post_init__(self):
        """Refuse nonsense at once (the CLI checks its options here, before loading)."""
        from ..sampling import SamplingParams

        SamplingParams(self.temperature, self.top_p, self.top_k, self.min_p)
        validate.max_tokens(self.max_tokens)
        validate.kv_quantization(self.kv_bits, self.kv_group_size)
        if self.block_size not in (None, "auto"):
            validate.block_size(self.block_size, None)


class ChatSession:
    """A conversation with a target (and optional drafter) that keeps its caches across
    turns."""

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
        policy: AdaptiveBlockSize | None = None,
    ):
        self.model, self.draft = model, draft
        self.tokenizer = wrap_tokenizer(tokenizer)
        self.system, self.thinking = system, thinking
        self.settings = settings or Settings()
        self.reuse_cache = reuse_cache
        self.raw = raw  # no chat template: the prompt is the messages' text as-is
        self.names = names or {}
        self.context = context_length(model)
        self.messages: list[dict] = []
        self.turns: list[TurnStats] = []
        self.cache = self._new_cache()
        self._last: conversation.Exchange | None = None  # the last prompt + answer
        # "auto"'s policy, e.g. calibrated by the CLI's warm-up (engine/calibrate.py)
        self._adaptive: AdaptiveBlockSize | None = policy
        # prompt lookup's index of the whole conversation, extended turn by turn
        self.lookup = LookupIndex()
        self._grammars = None  # structured.Grammars, for the settings' grammar

    def _new_cache(self):
        """Empty caches for this session's pair, its KV cache quantized as the
        settings say."""
        s = self.settings
        return make_prompt_cache(self.model, self.draft, s.kv_bits, s.kv_group_size)

    # -- prompts ----------------------------------------------------------------------
    @property
    def template(self) -> str:
        return conversation.chat_template(self.tokenizer)

    @property
    def thinking_supported(self) -> bool:
        return conversation.supports_thinking(self.tokenizer)

    def render_text(self, messages: list[dict] | None = None) -> str:
        """The prompt text for `messages` (default: the history) plus the assistant
        header."""
        return self.prompt(messages).text

    def prompt(self, messages: list[dict] | None = None) -> conversation.Prompt:
        """`render_text`, with where message text spells special tokens (encoded as
        plain text: no role can be forged)."""
        messages = self.messages if messages is None else messages
        return conversation.render_prompt(
            self.tokenizer,
            [{"role": m["role"], "content": m["content"]} for m in messages],
            system=self.system,
            thinking=self.thinking,
            raw=self.raw,
        )

    def render(self, messages: list[dict] | None = None) -> list[int]:
        return self.encode(self.prompt(messages))

    def encode(self, prompt: str | conversation.Prompt) -> list[int]:
        """Prompt ids; the last exchange keeps its exact ids (the answer as generated,
        not re-tokenized) when the template renders it verbatim, so the cache
        matches."""
        special = not self.template or self.raw
        return conversation.encode(self.tokenizer, prompt, self._last, special=special)

    # -- state ------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        if self.block_size != 1:
            return "dflash"
        return "lookup" if self.lookup_on else "plain"

    @property
    def lookup_on(self) -> bool:
        """Prompt lookup this turn: as asked, else with "auto"."""
        asked = self.settings.lookup
        return self.block_size == "auto" if asked is None else asked

    @property
    def block_size(self) -> int | str:
        """The verify block size, or "auto" (chosen per block from measured speed)."""
        if self.draft is None or not self.settings.draft_on:
            return 1
        return self.settings.block_size or "auto"

    def _block_policy(self):
        # one adaptive policy per session, so what it learned carries over between turns
        if self.block_size == 1 and self.lookup_on:  # no drafter: plain or a copy
            if self._adaptive is None or self._adaptive.sizes != [1]:
                self._adaptive = AdaptiveBlockSize(1)
            return self._adaptive
        if self.block_size != "auto":
            return self.block_size
        if self._adaptive is None or self._adaptive.sizes == [1]:
            self._adaptive = AdaptiveBlockSize.for_drafter(self.draft)
        return self._adaptive

    @property
    def cached_tokens(self) -> int:
        return len(self.cache.tokens)

    def baseline_tps(self) -> float | None:
        """Mean plain-decoding tok/s measured in this session (needs a few tokens)."""
        return baseline_tps(self.turns)

    def reset(self):
        self.messages.clear()
        self._last = None
        self.cache = self._new_cache()
        self.lookup.clear()

    def _cache_ok(self) -> bool:
        n = len(self.cache.tokens)
        offsets = [
            c.offset
            for c in self.cache.target + (self.cache.draft or [])
            if isinstance(getattr(c, "offset", None), int)
        ]
        return all(o == n for o in offsets)

    def grammar_processor(self):
        """A fresh processor of the settings' grammar (one per answer)."""
        from ..structured import Grammars

        if self._grammars is None:
            vocab = as_target(self.model, self.draft).vocab_size
            self._grammars = Grammars(self.tokenizer, vocab)
        return self._grammars.processor(self.settings.grammar)

    # -- a turn -----------------------------------------------------------------------
    def stream(self, text: str, progress=None) -> Generator[Chunk, None, None]:
        """Answer `text`, one Chunk per verified block. Closing the iterator early (or a
        KeyboardInterrupt) keeps the partial answer in the history, marked interrupted.
        Raises ValueError at once (before any work) for an empty or too long prompt.
        `progress(done, total)` hears of the prompt's prefill, chunk by chunk."""
        if not text.strip():
            raise ValueError("Empty message: type something (or /help).")
        validate.text(text, "This message")
        user = {"role": "user", "content": text}
        prompt = self.prompt(self.messages + [user])
        ids = self.encode(prompt)
        max_tokens = self.settings.max_tokens
        if self.context:
            room = self.context - len(ids)
            if room <= 0:
                fix = (
                    "/reset the conversation or send a shorter message"
                    if self.messages
                    else "shorten the prompt"
                )
                raise ValueError(
                    f"This prompt is {len(ids)} tokens but the model's context is "
                    f"{self.context}: {fix}."
                )
            max_tokens = room if max_tokens < 0 else min(max_tokens, room)
        return self._run(user, prompt.text, ids, max_tokens, progress)

    def _run(
        self,
        user: dict,
        prompt_text: str,
        ids: list[int],
        max_tokens: int,
        progress=None,
    ) -> Generator[Chunk, None, None]:
        s = self.settings
        if not self.reuse_cache:
            self.cache = self._new_cache()
        self.messages.append(user)
        turn = Turn(
            self.mode, self.block_size, conversation.opens_thinking(prompt_text)
        )
        gen = stream_generate(
            self.model,
            self.draft,
            self.tokenizer,
            ids,
            block_size=self._block_policy(),
            lookup=self.lookup if self.lookup_on else False,
            max_tokens=max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            prompt_cache=self.cache,
            seed=None if s.seed is None else s.seed + len(self.turns),
            prompt_progress_callback=progress,
            logits_processors=[self.grammar_processor()] if s.grammar else None,
        )
        failed = False
        try:
            for r in gen:
                yield turn.add(r)
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            failed = not isinstance(e, GeneratorExit)
            raise
        finally:
            gen.close()
            if failed:  # an error: drop the turn, start the caches afresh
                self.messages.pop()
                self.cache = self._new_cache()
                self._last = None
            else:
                self._finish(turn)
                self._last = conversation.Exchange(
                    prompt_text + turn.generated_text, ids + turn.ids
                )

    def _finish(self, turn: Turn):
        st = turn.stats
        if st.finish_reason is None:
            st.finish_reason = "interrupted"
        base = self.baseline_tps()
        if st.mode == "dflash" and base and st.generation_tps:
            st.speedup = st.generation_tps / base
        self.turns.append(st)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": turn.content,
            "stats": asdict(st),
        }
        if st.finish_reason == "interrupted":
            message["interrupted"] = True
        self.messages.append(message)
        if not self._cache_ok():
            self.cache = self._new_cache()

    # -- commands, statistics, transcript ---------------------------------------------
    def command(self, line: str) -> tuple[str, str]:
        """A slash command: (action, message); actions: help, stats, exit, info."""
        return run_command(self, line)

    def stats(self) -> dict:
        """Session totals for /stats."""
        return {
            **totals(self.turns),
            "cached_tokens": self.cached_tokens,
            "context": self.context,
            "mode": self.mode,
            "block_size": self.block_size,
            "temperature": self.settings.temperature,
        }

    def transcript(self) -> dict:
        return transcript(self.messages, self.system, asdict(self.settings), self.names)

    def save(self, path, overwrite: bool = False) -> Path:
        """Write the transcript; FileExistsError for an existing file unless
        `overwrite`."""
        return save(self.transcript(), path, overwrite)
