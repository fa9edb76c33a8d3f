"""--init-from a drafter with fewer layers: the new layers start as the identity."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from dflash_mlx import load_draft
from dflash_mlx.models.draft import Model
from dflash_mlx.train.export import init_weights


def with_layers(draft, n):
    """A fresh random drafter shaped like `draft` but with `n` layers."""
    args = vars(draft.args) | {
        "num_hidden_layers": n,
        "layer_types": [draft.args.layer_types[0]] * n,
    }
    mx.random.seed(7)
    model = Model(type(draft.args)(**args))
    mx.eval(model.parameters())
    return model


def hidden(draft, features, block):
    cache = draft.make_cache()
    draft.absorb(features, cache)
    return draft(block, cache)


@pytest.fixture(scope="module")
def donor(tiny_pair):
    _, d = tiny_pair("llama")
    return d, load_draft(str(d))


def test_grown_drafter_starts_exactly_where_the_donor_stood(donor):
    path, loaded = donor
    small, grown = with_layers(loaded, 2), with_layers(loaded, 4)  # MLX kernels both
    assert init_weights(small, path) == [] and init_weights(grown, path) == [2, 3]
    mx.random.seed(0)
    features = mx.random.normal((1, 11, small.fc.weight.shape[1]))
    block = mx.random.normal((1, small.args.block_size, small.args.hidden_size))
    assert mx.array_equal(
        hidden(grown, features, block), hidden(small, features, block)
    )
    ours, theirs = (
        dict(tree_flatten(grown.parameters())),
        dict(tree_flatten(small.parameters())),
    )
    assert all(mx.array_equal(ours[k], v) for k, v in theirs.items())


def test_new_layers_learn_from_the_first_step(donor):
    path, small = donor
    grown = with_layers(small, len(small.layers) + 1)
    init_weights(grown, path)
    mx.random.seed(0)
    features = mx.random.normal((1, 11, small.fc.weight.shape[1]))
    block = mx.random.normal((1, small.args.block_size, small.args.hidden_size))

    def loss(_):
        return (hidden(grown, features, block) ** 2).mean()

    grads = dict(tree_flatten(nn.value_and_grad(grown, loss)(None)[1]))
    new = f"layers.{len(small.layers)}"
    assert mx.abs(grads[f"{new}.self_attn.o_proj.weight"]).max().item() > 0
    assert mx.abs(grads[f"{new}.mlp.down_proj.weight"]).max().item() > 0


def test_a_drafter_with_fewer_layers_than_the_donor_is_refused(donor):
    path, small = donor
    with pytest.raises(ValueError, match="at least the donor's"):
        init_weights(with_layers(small, len(small.layers) - 1), path)
