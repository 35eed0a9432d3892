"""The plots of ``specbench train-policy``'s sweeps: chosen-arm shares against alpha, speed (or reward)
against the number of training queries."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from specbench.pipelines.tables import pyplot

log = logging.getLogger(__name__)


def _pyplot(path: Path):
    """matplotlib's pyplot (Agg backend), or None with a warning when matplotlib is missing."""
    try:
        return pyplot()
    except ImportError:
        log.warning("matplotlib is not installed: %s skipped (pip install matplotlib)", path.name)
        return None


def plot_alpha(df: pd.DataFrame, arms: list[str], path: Path) -> None:
    plt = _pyplot(path)
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm in arms:
        ax.plot(df.alpha, df[f"share_{arm}"], marker="o", label=f"share {arm}")
    ax.set_xlabel("alpha (1: alignment only, 0: cost only)")
    ax.set_ylabel("share of validation queries")
    if df.speedup_replayed.notna().any():
        ax2 = ax.twinx()
        ax2.plot(df.alpha, df.speedup_replayed, "k--", marker="s", label="speedup (replayed)")
        ax2.set_ylabel("speedup over autoregressive")
        ax2.legend(loc="upper right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_data_efficiency(df: pd.DataFrame, path: Path) -> None:
    plt = _pyplot(path)
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    use_speed = df.speedup_replayed.notna().any()
    y, ref = ("speedup_replayed", "oracle_speedup") if use_speed else ("val_reward", "oracle_reward")
    ax.plot(df.n_examples, df[y], marker="o", label="policy")
    ax.plot(df.n_examples, df[ref], "k:", label="oracle")
    for column, style, label in (
        ("best_single_speedup", "g--", "best single arm"),
        ("random_speedup", "r--", "random"),
    ):
        if use_speed and column in df and df[column].notna().any():
            ax.plot(df.n_examples, df[column], style, label=label)
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(list(df.n_examples), [str(int(n)) for n in df.n_examples])
    ax.set_xlabel("training queries")
    ax.set_ylabel("speedup over autoregressive (replayed)" if use_speed else "validation reward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
