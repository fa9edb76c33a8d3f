"""Prompt lookup: drafts copied from the token history, a second source beside the
drafter.

Agents and coding assistants restate their context: a function pasted back with a small
change, a diff's context lines, a quoted question. There the next tokens are those that
followed the last few tokens where they occurred before, and copying them costs no
drafter forward. The engine verifies a copy like any draft; under sampling it is a
deterministic draft (q one-hot: `verify.accept_lookup`), so the output stays the
target's. Which source a block uses is the policy's choice (`policy.Plan`).

The piece every engine shares, in token ids (nothing here depends on timing or
randomness: two ranks with the same history propose the same ids):

- `LookupIndex(min_ngram=1, max_ngram=4)`: an index over a token history. For each n in
  min_ngram..max_ngram it maps every n-gram to where its latest occurrence was followed.
  `extend(tokens)` adds committed tokens at a bounded cost per token (one dict update
  per n, never a scan of the history).
- `sync(tokens)`: makes the history `tokens` in one call (the prompt; in a chat or the
  server the whole conversation). When the index already holds a prefix of them (the
  next turn of a conversation) only the rest is indexed; otherwise it starts over.
- `propose(limit)`: the continuation, up to `limit` ids, of the longest n-gram that ends
  the history and occurred before (its latest occurrence); [] when none did. `match`
  then holds that n (0: none), which the policy uses: longer matches are more often
  right. A continuation that runs into the history's end repeats with its period (a
  copy of a copy, as LZ77 copies), so a repeating pattern proposes `limit` ids.
"""

from collections.abc import Iterable, Sequence

from ..validate import is_int

MIN_NGRAM = 1
MAX_NGRAM = 4


class LookupIndex:
    """An incremental n-gram index over a token history (see the module docstring)."""

    def __init__(self, min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM):
        for name, n in (("min_ngram", min_ngram), ("max_ngram", max_ngram)):
            if not is_int(n) or not 1 <= n <= 64:
                raise ValueError(
                    f"{name} must be an integer from 1 to 64 (tokens), got {n!r}."
                )
        if max_ngram < min_ngram:
            raise ValueError(
                f"max_ngram ({max_ngram}) must be at least min_ngram ({min_ngram})."
            )
        self.min_ngram, self.max_ngram = int(min_ngram), int(max_ngram)
        self.tokens: list[int] = []
        # _tables[n - min_ngram]: n-gram -> index of the token that followed its
        # latest occurrence
        self._tables: list[dict[tuple[int, ...], int]] = []
        self.clear()

    def __len__(self) -> int:
        return len(self.tokens)

    def clear(self):
        """Forget the history."""
        self.tokens = []
        self._tables = [{} for _ in range(self.min_ngram, self.max_ngram + 1)]
        self.match = 0

    def extend(self, tokens: Iterable[int]):
        """Add committed tokens to the end of the history."""
        history, tables, low = self.tokens, self._tables, self.min_ngram
        for token in tokens:
            end = len(history)
            for n, table in enumerate(tables, start=low):
                if n > end:
                    break
                table[tuple(history[end - n : end])] = end
            history.append(int(token))

    def sync(self, tokens: Sequence[int]):
        """Make the history `tokens`: only the new tail is indexed when the history
        is a prefix of them, else everything afresh."""
        held = len(self.tokens)
        if held > len(tokens) or list(tokens[:held]) != self.tokens:
            self.clear()
            held = 0
        self.extend(tokens[held:])

    def propose(self, limit: int) -> list[int]:
        """Up to `limit` ids that followed the latest earlier occurrence of the longest
        n-gram ending the history; [] when none occurred before."""
        self.match = 0
        history = self.tokens
        end = len(history)
        if limit < 1:
            return []
        for n in range(min(self.max_ngram, end), self.min_ngram - 1, -1):
            start = self._tables[n - self.min_ngram].get(tuple(history[end - n :]))
            if start is None:
                continue
            self.match = n
            out = history[start : start + limit]
            period = end - start  # a copy that reaches the end repeats itself
            while len(out) < limit:
                out.append(out[len(out) - period])
            return out
        return []
