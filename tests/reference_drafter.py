"""Our drafter's weights in the reference's drafter class (`dflash.model_mlx`)."""

from mlx.utils import tree_flatten


def reference_draft(draft, cls=None):
    """A reference drafter (`cls`, by default `DFlashDraftModel`), `draft`'s weights."""
    from dflash import model_mlx as ref

    from dflash_mlx.bench import reference_config

    model = (cls or ref.DFlashDraftModel)(reference_config(draft.args))
    model.load_weights(list(tree_flatten(draft.parameters())))
    return model
