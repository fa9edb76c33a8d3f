"""Drafter test doubles that force known acceptance patterns.

They wrap a real drafter and replace its proposals with a known continuation (optionally
corrupted at chosen offsets), reading the block's absolute position from the cache.
"""

import mlx.core as mx

from dflash_mlx.models.draft import Model


class OracleDraft(Model):
    """Proposes `reference[pos+1:pos+L]`; wrong where `wrong(offset_in_block, pos)`."""

    def __init__(self, args, reference, wrong=lambda k, i: False):
        super().__init__(args)
        self.reference = list(reference)
        self.wrong = wrong
        self._pos = 0
        self._len = 0

    def __call__(self, block_embeddings, cache):
        # a batch's caches (models/ragged.py) give each row's position
        self._pos = getattr(cache[0], "positions", None) or cache[0].offset
        self._len = block_embeddings.shape[1]
        return super().__call__(block_embeddings, cache)

    def finalize_logits(self, logits):
        vocab = logits.shape[-1]
        if isinstance(self._pos, tuple):  # every row proposes the same continuation
            return mx.stack(
                [
                    proposal_logits(self.reference, p, self._len, vocab, self.wrong)
                    for p in self._pos
                ]
            )
        return proposal_logits(self.reference, self._pos, self._len, vocab, self.wrong)


def proposal_logits(reference, pos, length, vocab, wrong):
    rows = []
    for k in range(1, length):
        i = pos + k
        tok = reference[i] if i < len(reference) else 0
        if wrong(k, i):
            tok = (tok + 1) % vocab
        rows.append(tok)
    return mx.eye(vocab)[mx.array(rows)] * 100.0


class RowOracleDraft(Model):
    """A batch's oracle: each row proposes its own sequence's `reference` (the
    member's, in `references`), wrong where `wrong(offset_in_block, position)`."""

    def __init__(self, args, wrong=lambda k, i: False):
        super().__init__(args)
        self.wrong = wrong
        self.batch = None  # the engine.batch.Batch whose rows these are
        self.references: dict = {}  # member -> prompt + expected tokens
        self._pos: tuple = ()
        self._len = 0

    def __call__(self, block_embeddings, cache):
        self._pos = cache[0].positions
        self._len = block_embeddings.shape[1]
        return super().__call__(block_embeddings, cache)

    def finalize_logits(self, logits):
        rows = []
        for row, pos in enumerate(self._pos):
            member = self.batch.members[row] if row < len(self.batch.members) else None
            reference = self.references.get(member, [])
            vocab = logits.shape[-1]
            rows.append(proposal_logits(reference, pos, self._len, vocab, self.wrong))
        return mx.stack(rows)
