"""Pipelines: ``run(cfg) -> output directory``. They print tables only through ``tables.py``."""
