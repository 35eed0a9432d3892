"""specbench: multi-drafter speculative decoding research toolkit."""

__version__ = "0.1.0"
