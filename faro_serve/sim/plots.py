"""Suite plots (matplotlib, Agg): lost cluster utility per policy and capacity (paper
Figure 10/15 style, error bars = SD over seeds) and a cluster utility timeline (Figure 11)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


COLOURS = {
    "faro-sum": "#08519c",
    "faro-fairsum": "#3182bd",
    "faro-fair": "#6baed6",
    "faro-penaltysum": "#9ecae1",
    "faro-penaltyfairsum": "#c6dbef",
    "oracle": "black",
    "mark": "#ff7f0e",
    "mark-saturation": "#ffbb78",
    "aiad": "#2ca02c",
    "fairshare": "#7f7f7f",
    "oneshot": "#d62728",
    "ray-serve": "#8c564b",
    "ray-native": "#8c564b",
    "swayam": "#e377c2",
    "inferline": "#9467bd",
    "infaas": "#bcbd22",
}


def _save(fig, path: Path) -> None:
    """PNG with a 64-colour palette: a third of the size, no visible loss for line/bar plots."""
    from PIL import Image

    fig.savefig(path)
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=64)
    small.save(path, optimize=True)


def _colour(policy: str, k: int):
    """A fixed colour per known policy (blues for Faro), tab10 for others."""
    import matplotlib

    return COLOURS.get(policy, matplotlib.colormaps["tab10"](k % 10))


def plot_lost_utility(agg: list[dict], path: Path, title: str = "") -> None:
    plt = _plt()
    caps = sorted({a["capacity"] for a in agg}, reverse=True)
    # policies in the order of their mean lost utility over the capacities
    pols = sorted(
        {a["policy"] for a in agg}, key=lambda p: np.mean([a["lost_utility"] for a in agg if a["policy"] == p])
    )
    width = 0.8 / max(len(pols), 1)
    fig, ax = plt.subplots(figsize=(10, 4.2), dpi=90)
    for k, pol in enumerate(pols):
        col = _colour(pol, k)
        vals = [next((a for a in agg if a["capacity"] == c and a["policy"] == pol), None) for c in caps]
        x = np.arange(len(caps)) + (k - (len(pols) - 1) / 2) * width
        ax.bar(
            x,
            [v["lost_utility"] if v else np.nan for v in vals],
            width,
            yerr=[v["lost_utility_sd"] if v else 0 for v in vals],
            label=pol,
            color=col,
            edgecolor="white",
            linewidth=0.3,
            error_kw={"elinewidth": 0.8},
        )
    ax.set_xticks(np.arange(len(caps)), [f"{c:g} replicas" for c in caps])
    ax.set_ylabel("lost cluster utility (lower is better)")
    ax.set_title(title or "Lost cluster utility per policy and cluster size", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(ncol=2, fontsize=7, frameon=False, bbox_to_anchor=(1.0, 1.0), loc="upper left")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


# The paper's Figure 11 set (Faro, its baselines) plus the best seed system; others would
# only clutter the plot (results.csv / timeline.csv have every policy).
TIMELINE_POLICIES = ("oracle", "faro-fairsum", "mark", "aiad", "fairshare", "oneshot", "inferline")


def plot_timeline(timelines: dict, capacity: float, path: Path, seed: int = 0, smooth_min: int = 5) -> None:
    """Cluster utility per minute at one capacity (one seed), ``smooth_min``-minute mean."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 3.6), dpi=90)
    avail = {p for (p, c, s) in timelines if c == capacity and s == seed}
    chosen = [p for p in TIMELINE_POLICIES if p in avail] or sorted(avail)[:8]
    for k, pol in enumerate(chosen):
        tl = np.asarray(timelines[(pol, capacity, seed)], dtype=float)
        w = max(1, smooth_min)
        sm = np.convolve(tl, np.ones(w) / w, mode="valid")
        ax.plot(
            np.arange(sm.size) + w - 1,
            sm,
            label=pol,
            color=_colour(pol, k),
            linewidth=1.0,
            linestyle="--" if pol == "oracle" else "-",
        )
    ax.set_xlabel("minute")
    ax.set_ylabel(f"cluster utility ({smooth_min}-min mean)")
    ax.set_title(f"Cluster utility over the run, capacity {capacity:g}, seed {seed}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(ncol=1, fontsize=7, frameon=False, bbox_to_anchor=(1.0, 1.0), loc="upper left")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
