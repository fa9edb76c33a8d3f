"""The `--plot` PNG: acceptance-length histograms and decode tok/s per prompt."""

from .engines import BASELINE
from .measure import Record


def write_plot(records: list[Record], summary: dict, path) -> None:
    """A PNG: acceptance-length histograms and decode tok/s per prompt for each mode."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError(
            "--plot needs matplotlib: pip install 'mlx-dflash[plot]'."
        ) from e
    rows = [r for r in summary["rows"] if r["dataset"] == "all"] or summary["rows"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / max(len(rows), 1)
    for i, row in enumerate(rows):
        hist = row["tau_histogram"]  # one bar per length, "auto" rows included
        offset = (i - (len(rows) - 1) / 2) * width
        ax1.bar(
            [t + 1 + offset for t in range(len(hist))],
            [100 * h for h in hist],
            width,
            label=f"{row['dataset']} {row['engine']} B={row['block_size']}",
        )
    ax1.set(
        title="Acceptance length (tokens per target forward)",
        xlabel="tau",
        ylabel="% of blocks",
    )
    ax1.legend(fontsize=7)
    series = list(dict.fromkeys((r.engine, r.block_size) for r in records))
    for engine, bs in series:
        ys = [r.decode_tps for r in records if (r.engine, r.block_size) == (engine, bs)]
        ax2.plot(
            range(1, len(ys) + 1),
            ys,
            marker="o",
            ms=3,
            label="mlx-lm (plain)" if engine == BASELINE else f"{engine} B={bs}",
        )
    ax2.set(title="Decode speed per prompt", xlabel="prompt turn", ylabel="tok/s")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(str(path), dpi=120)
    plt.close(fig)
