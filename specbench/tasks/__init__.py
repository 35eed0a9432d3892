"""Datasets (native record formats), prompt formats and quality metrics."""

from specbench.tasks.datasets import load_dataset_config, load_shots
from specbench.tasks.formats import Query
from specbench.tasks.prompts import (
    Prompter,
    PromptFormat,
    build_prompt,
    check_templates,
    render,
    truncate_fields,
)

__all__ = [
    "PromptFormat",
    "Prompter",
    "Query",
    "build_prompt",
    "check_templates",
    "load_dataset_config",
    "load_shots",
    "render",
    "truncate_fields",
]
