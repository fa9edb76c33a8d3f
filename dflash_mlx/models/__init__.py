"""The models: the DFlash drafters (v1 `draft`, DFlash-2 `dflash2`, the
reduced-vocabulary head `draft_head`), the target side (`target`: one forward that
also yields the drafter's features, with exact rollback; its stand-ins in `taps`),
their caches (`cache`) and a drafter's shipped acceptance prior (`acceptance`).

May import the base modules (`kernels`, `sampling`, `distributed`, `files`, ...) and
`backend`; never `cpu` directly (its kernels arrive through `Kernels`), the engine or
anything above it.
"""
