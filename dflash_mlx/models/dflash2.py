"""DFlash-2 drafter: v1 plus grouped dynamic causal convolutions around attention and
MLP, and a candidate selector that picks each block token among the top-k logits with
a pairwise score against the previous pick."""

import mlx.core as mx
import mlx.nn as nn

from ..sampling import categorical
from . import draft as v1


def grouped_dynamic_conv(
    x: mx.array, dynamic: mx.array, base: mx.array, group_size: int
):
    """Causal conv along the block: out_t = sum_j (base_j + dynamic_t,j) * x_(t-j), per
    group.

    x (B, L, H); dynamic (B, L, K, G); base (K, H) with H = G * group_size.
    """
    B, L, H = x.shape
    G = H // group_size
    blocks = x.reshape(B, L, G, group_size)
    dynamic = dynamic.reshape(B, L, dynamic.shape[2], G, 1)
    out = mx.zeros_like(blocks)
    for j in range(base.shape[0]):
        shifted = (
            blocks
            if j == 0
            else mx.concatenate([mx.zeros_like(blocks[:, :j]), blocks[:, :-j]], axis=1)
        )
        out = out + base[j].reshape(1, 1, G, group_size).astype(x.dtype) * shifted
        out = out + dynamic[:, :, j] * shifted
    return out.reshape(B, L, H)


class GroupedDynamicCausalConv(nn.Module):
    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        groups = hidden_size // group_size
        self.base_kernel = mx.zeros((2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(
            hidden_size, 2 * kernel_size * groups, bias=False
        )

    def prepare(self, x):
        """Convolve the sub-layer input; return it with the kernel kept for `finish`."""
        groups = x.shape[-1] // self.group_size
        dynamic = self.kernel_projection(x).reshape(
            *x.shape[:-1], 2, self.kernel_size, groups
        )
        pre = grouped_dynamic_conv(
            x, dynamic[..., 0, :, :], self.base_kernel[0], self.group_size
        )
        return pre, dynamic[..., 1, :, :]

    def finish(self, x, dynamic):
        return grouped_dynamic_conv(x, dynamic, self.base_kernel[1], self.group_size)


class DecoderLayer(v1.DecoderLayer):
    def __init__(self, args: v1.ModelArgs, layer_type: str):
        super().__init__(args, layer_type)
        self.attention_conv = GroupedDynamicCausalConv(
            args.hidden_size, args.conv_kernel_size, args.conv_group_size
        )
        self.mlp_conv = GroupedDynamicCausalConv(
            args.hidden_size, args.conv_kernel_size, args.conv_group_size
        )

    def __call__(self, x, mask, cache):
        x_in, kernel = self.attention_conv.prepare(self.input_layernorm(x))
        h = x + self.attention_conv.finish(self.self_attn(x_in, mask, cache), kernel)
        x_in, kernel = self.mlp_conv.prepare(self.post_attention_layernorm(h))
        return h + self.mlp_conv.finish(self.mlp(x_in), kernel)


class CandidateSelector(nn.Module):
    def __init__(self, args: v1.ModelArgs):
        super().__init__()
        self.top_k = args.selector_top_k
        self.predecessor_codebook = nn.Embedding(args.vocab_size, args.selector_rank)
        self.successor_codebook = nn.Embedding(args.vocab_size, args.selector_rank)
        self.hidden_projection = nn.Linear(
            args.hidden_size, args.selector_rank, bias=False
        )

    def __call__(self, hidden, logits, anchor, temperature: float):
        """Walk the block left to right: (picks (L,), candidates (L, k), q (L, k) or
        None).

        hidden/logits are (L, ·) for the drafted positions; `anchor` is the token before
        them.
        """
        candidates = mx.argpartition(logits, -self.top_k, axis=-1)[..., -self.top_k :]
        unary = mx.take_along_axis(logits, candidates, axis=-1)
        hidden = self.hidden_projection(hidden)
        successors = self.successor_codebook(candidates)  # (L, k, rank)
        previous = anchor
        picks, q_rows = [], []
        for t in range(hidden.shape[0]):
            pair = (self.predecessor_codebook(previous) * hidden[t]) @ successors[t].T
            scores = unary[t] + pair
            if temperature > 0:
                q = mx.softmax(scores.astype(mx.float32) / temperature, axis=-1)
                choice = categorical(q)
                q_rows.append(q)
            else:
                choice = mx.argmax(scores, axis=-1)
            previous = candidates[t, choice]
            picks.append(previous)
        return mx.stack(picks), candidates, mx.stack(q_rows) if q_rows else None


class Model(v1.Model):
    """DFlash-2 drafter (architectures: DFlash2DraftModel)."""

    layer_class = DecoderLayer
    argmax_proposals = False  # the candidate selector picks them in order

    def __init__(self, args: v1.ModelArgs):
        super().__init__(args)
        self.candidate_selector = CandidateSelector(args)

    def propose(self, hidden, logits, anchor, params, noise=None):
        # Its picks are sequential over top-k candidates, so a seeded generation's
        # noise is not used for them: drafts stay exact to verify, they only agree less.
        picks, candidates, q = self.candidate_selector(
            hidden, logits, anchor, params.temperature
        )
        if q is None:
            return picks, None
        dense = mx.put_along_axis(
            mx.zeros(logits.shape, mx.float32), candidates, q, axis=-1
        )
        return picks, dense

    def sanitize(self, weights: dict) -> dict:
        weights = super().sanitize(weights)
        for name in ("predecessor_codebook", "successor_codebook"):
            key = f"candidate_selector.{name}"
            if key in weights:
                weights[f"{key}.weight"] = weights.pop(key)
        return weights
