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
        self._pos = cache[0].offset
        self._len = block_embeddings.shape[1]
        return super().__call__(block_embeddings, cache)

    def finalize_logits(self, logits):
        return proposal_logits(
            self.reference, self._pos, self._len, logits.shape[-1], self.wrong
        )


def proposal_logits(reference, pos, length, vocab, wrong):
    rows = []
    for k in range(1, length):
        i = pos + k
        tok = reference[i] if i < len(reference) else 0
        if wrong(k, i):
            tok = (tok + 1) % vocab
        rows.append(tok)
    return mx.eye(vocab)[mx.array(rows)] * 100.0
