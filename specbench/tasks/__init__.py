"""Datasets (native record formats), prompt formats and quality metrics."""

from specbench.tasks.datasets import Query, load_queries
from specbench.tasks.prompts import build_prompt

__all__ = ["Query", "build_prompt", "load_queries"]
