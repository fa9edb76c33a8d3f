"""Benchmark library half: plain mlx-lm decoding against DFlash on the same prompts, the
losslessness check at temperature 0, and summaries. Nothing here prints; the CLI
renders.

engines.py (what is compared) · measure.py (timing every prompt turn) · summary.py
(rows, JSON report, running tally) · environment.py (machine, BLAS, versions) ·
plot.py (the PNG). May import anything of the library below the commands (the text
API, loading, the engine, models, base modules); never chat/, serve/, train/ or cli/.
"""

from .engines import (
    BASELINE,
    PLAIN,
    Engine,
    dflash_engine,
    mlx_lm_engine,
    plain_engine,
    reference_config,
    reference_engine,
)
from .environment import describe_weights, detect_blas, environment
from .measure import (
    BenchConfig,
    Record,
    chat_ids,
    count_turns,
    load_samples,
    measure,
    parse_block_sizes,
    run,
    warmup,
)
from .plot import write_plot
from .summary import SCHEMA, Tally, compact, report, summarize

__all__ = [
    "BASELINE",
    "PLAIN",
    "SCHEMA",
    "BenchConfig",
    "Engine",
    "Record",
    "Tally",
    "chat_ids",
    "compact",
    "count_turns",
    "describe_weights",
    "detect_blas",
    "dflash_engine",
    "environment",
    "load_samples",
    "measure",
    "mlx_lm_engine",
    "parse_block_sizes",
    "plain_engine",
    "reference_config",
    "reference_engine",
    "report",
    "run",
    "summarize",
    "warmup",
    "write_plot",
]
