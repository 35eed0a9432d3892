"""Model loading (hub id, local directory, embedded entries), KV caches and the Target wrapper."""

from specbench.models.devices import resolve_device, resolve_dtype
from specbench.models.loading import EMBEDDED_MODELS, LoadedModel, load_model
from specbench.models.target import Target

__all__ = ["EMBEDDED_MODELS", "LoadedModel", "Target", "load_model", "resolve_device", "resolve_dtype"]
