"""The names every layer shares: the arm that does not draft (one ordinary target step per round), and the methods
that run only in batches (``decoding.batch_size`` above 1: ``pipelines/batched.py``)."""

AUTOREGRESSIVE = "autoregressive"
GOODPUT = "goodput:"  # goodput:<drafter>: the drafter with the batch budget cutting each round's drafts
HF_GENERATE = "hf:generate"  # Hugging Face generate on the same batch: the library's batched greedy decoding
BATCH_ONLY = (GOODPUT, HF_GENERATE)
