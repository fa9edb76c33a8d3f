"""Pack a trained drafter as the built-in default: float16 weights, gzip-compressed.

    python examples/pack_default_drafter.py runs/smollm2-dflash

writes dflash_mlx/drafters/smollm2-135m-instruct/{config.json, README.md,
model.safetensors.gz} and, when the drafter has them, draft_vocab.json and
acceptance.json (a draft vocabulary still stored as a tensor in an older export moves
to draft_vocab.json, so the reference `dflash` loads the weights too).
`dflash_mlx.loading.defaults.default_draft()` unpacks it once into the user cache; on a
CPU the weights run in float32 again (see loading.drafters.load_draft).
"""

import argparse
import gzip
import json
import shutil
from pathlib import Path

import mlx.core as mx

from dflash_mlx.loading.defaults import DRAFT_NAME, DRAFTERS_DIR
from dflash_mlx.models.acceptance import ACCEPTANCE_FILE
from dflash_mlx.models.draft_head import DRAFT_VOCAB_FILE, write_draft_vocab

SIDE_FILES = ("README.md", DRAFT_VOCAB_FILE, ACCEPTANCE_FILE)


def pack(src: Path, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.safetensors*"), *(out / f for f in SIDE_FILES)]:
        old.unlink(missing_ok=True)
    weights = mx.load(str(src / "model.safetensors"))
    vocab = weights.pop("draft_vocab", None)
    half = {
        k: v.astype(mx.float16) if mx.issubdtype(v.dtype, mx.floating) else v
        for k, v in weights.items()
    }
    tmp = out / "model.safetensors"
    mx.save_safetensors(str(tmp), half, metadata={"format": "mlx"})
    with (
        open(tmp, "rb") as f,
        gzip.open(out / "model.safetensors.gz", "wb", compresslevel=9) as g,
    ):
        shutil.copyfileobj(f, g)
    tmp.unlink()
    config = json.loads((src / "config.json").read_text())
    config["torch_dtype"] = "float16"
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in SIDE_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    if vocab is not None:
        write_draft_vocab(out, vocab.tolist())
    size = (out / "model.safetensors.gz").stat().st_size / 1e6
    print(f"packed {src} -> {out} ({size:.1f} MB compressed)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "drafter", type=Path, help="A drafter folder written by dflash-mlx train."
    )
    parser.add_argument("--out", type=Path, default=DRAFTERS_DIR / DRAFT_NAME)
    args = parser.parse_args()
    pack(args.drafter, args.out)
