"""The drafter's configuration: the z-lab config.json's fields and their defaults."""

from dataclasses import dataclass, field, fields
from typing import Any

ARCHITECTURES = ("DFlashDraftModel", "DFlash2DraftModel")
LAYER_TYPES = ("full_attention", "sliding_attention")


def default_target_layer_ids(
    num_target_layers: int, num_draft_layers: int
) -> list[int]:
    """Layer ids used when a config names none (the DFlash convention)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [
        round(1 + k * span / (num_draft_layers - 1)) for k in range(num_draft_layers)
    ]


@dataclass
class ModelArgs:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 40960
    block_size: int = 16
    layer_types: list[str] = field(default_factory=list)
    sliding_window: int | None = None
    is_causal: bool | None = None
    final_logit_softcapping: float | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    architecture: str = "DFlashDraftModel"
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    draft_vocab_size: int = 0  # 0: propose from the whole target vocabulary

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if not self.layer_types:
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]

    @classmethod
    def from_config(cls, config: dict) -> "ModelArgs":
        """Read a z-lab drafter config.json (fields may sit at top level or in
        dflash_config)."""
        flat = dict(config)
        flat.update(config.get("dflash_config") or {})
        rope = config.get("rope_parameters") or config.get("rope_scaling")
        if rope:
            flat.setdefault("rope_theta", rope.get("rope_theta", cls.rope_theta))
            if rope.get("rope_type", rope.get("type", "default")) == "default":
                rope = None
        flat["rope_scaling"] = rope
        archs = config.get("architectures") or ["DFlashDraftModel"]
        flat["architecture"] = archs[0]
        if not flat.get("target_layer_ids") and "num_target_layers" in flat:
            flat["target_layer_ids"] = default_target_layer_ids(
                flat["num_target_layers"], flat["num_hidden_layers"]
            )
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in flat.items() if k in names})

    def to_config(self) -> dict:
        """The z-lab config.json form of these arguments."""
        keys = (
            "target_layer_ids",
            "mask_token_id",
            "final_logit_softcapping",
            "input_embedding_scale",
            "output_multiplier",
            "conv_kernel_size",
            "conv_group_size",
            "selector_rank",
            "selector_top_k",
            "draft_vocab_size",
        )
        dflash = {
            k: getattr(self, k) for k in keys if getattr(self, k) not in (None, 0)
        }
        dflash["block_size"] = self.block_size
        top = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in keys and f.name != "architecture"
        }
        top = {k: v for k, v in top.items() if v is not None}
        return {
            "architectures": [self.architecture],
            "model_type": "dflash",
            **top,
            "dflash_config": dflash,
        }
