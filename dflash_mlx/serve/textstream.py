"""From committed token ids to what a client sees: text, reasoning and tool calls.

Each request detokenizes its own tokens, holds back text that could be the start of a
stop string (so nothing past a stop is ever sent, even when it spans blocks) and cuts
exactly at the first one, then lets mlx-lm's `TextStateMachine` split reasoning and
tool-call text from the answer; tool calls are parsed by the family's parser
(toolformats.py: mlx-lm's where it has one). A call that does not parse is given back
as text, with a log line.
"""

import logging
import uuid
from dataclasses import dataclass, field

from mlx_lm.generate import TextStateMachine

from .toolformats import OutputFormat

log = logging.getLogger("dflash_mlx.serve")


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Delta:
    """New output since the last delta."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # {"id", "name", "arguments"}
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls or self.logprobs)

    def extend(self, other: "Delta") -> "Delta":
        self.content += other.content
        self.reasoning += other.reasoning
        self.tool_calls += other.tool_calls
        self.logprobs += other.logprobs
        return self


class StopMatcher:
    """Cuts a text stream at the first of several stop strings, holding back any tail
    that could still become one."""

    def __init__(self, stops=()):
        self.stops = [s for s in stops if s]
        self._held = ""

    def push(self, text: str) -> tuple[str, str | None]:
        """(text that is safe to send, the stop string hit or None)."""
        buf = self._held + text
        hit, start, end = None, 0, None
        for s in self.stops:
            i = buf.find(s)
            # the stop that completes first ends the output
            if i >= 0 and (end is None or (i + len(s), i) < (end, start)):
                hit, start, end = s, i, i + len(s)
        if hit is not None:
            self._held = ""
            return buf[:start], hit
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        self._held = buf[len(buf) - hold :]
        return buf[: len(buf) - hold], None

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


class TextStream:
    """One request's output, fed block by block."""

    def __init__(
        self,
        tokenizer,
        output: OutputFormat,
        *,
        stop=(),
        tools=None,
        initial_state: str = "normal",
    ):
        self.detokenizer = tokenizer.detokenizer
        self.output = output
        self.tools = tools
        self.stops = StopMatcher(stop)
        self._state = output.machine.make_state(initial_state)
        self._previous = initial_state
        self._tool_text = ""
        self.tokens: list[int] = []  # tokens the output consumed (EOS included)
        self.stop_hit: str | None = None
        self.made_tool_call = False
        self.saw_reasoning = initial_state == "reasoning"  # text not in the answer

    def feed(self, tokens: list[int], logprobs=None, eos: bool = False) -> Delta:
        """Consume a block's tokens (the last is EOS when `eos`) up to a stop string."""
        delta = Delta()
        for i, token in enumerate(tokens):
            if self.stop_hit is not None:
                break
            self.tokens.append(token)
            if eos and i == len(tokens) - 1:
                break  # counted, never shown
            if logprobs:
                delta.logprobs.append(TokenLogprob(token, *logprobs[i]))
            self.detokenizer.add_token(token)
            self._push(self.detokenizer.last_segment, delta)
        return delta

    def finish(self) -> Delta:
        """The held-back rest of the output, once generation has ended."""
        delta = Delta()
        if self.stop_hit is None:
            self.detokenizer.finalize()
            self._push(self.detokenizer.last_segment, delta)
        if self.stop_hit is None:
            self._split(self.stops.flush(), delta)
        self._state, rest, state = TextStateMachine.flush(self._state)
        self._collect([(state, rest)], delta)
        if self._previous == "tool" and self._tool_text:
            self._emit_tool_call(delta)
        return delta

    def _push(self, text: str, delta: Delta):
        safe, hit = self.stops.push(text)
        if hit is not None:
            self.stop_hit = hit
        self._split(safe, delta)

    def _split(self, text: str, delta: Delta):
        if text:
            self._state, segments = TextStateMachine.split(self._state, text)
            self._collect(segments, delta)

    def _collect(self, segments, delta: Delta):
        for state, text in segments:
            if state != "normal" and text:
                self.saw_reasoning = True  # text the answer's content leaves out
            if state == "reasoning":
                delta.reasoning += text
            elif state == "tool":
                self._tool_text += text
            else:
                if self._previous == "tool":
                    self._emit_tool_call(delta)
                delta.content += text
            self._previous = state

    def _emit_tool_call(self, delta: Delta):
        text, self._tool_text = self._tool_text, ""
        fmt = self.output
        try:
            if fmt.parser is None or (fmt.needs_tools and not self.tools):
                raise ValueError("no tools declared")
            parsed = fmt.parser(text, self.tools)
            calls = [
                {
                    "id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                    "name": str(call["name"]),
                    "arguments": call.get("arguments", {}),
                }
                for call in (parsed if isinstance(parsed, list) else [parsed])
            ]
        except Exception as e:  # malformed: the model's text, as text
            log.warning("a tool call that does not parse is sent as text (%s): %r",
                        e, text[:200])  # fmt: skip
            delta.content += fmt.start + text + fmt.end
            return
        delta.tool_calls += calls
        self.made_tool_call = self.made_tool_call or bool(calls)
