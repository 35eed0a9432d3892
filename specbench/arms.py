"""The names every layer shares: the arm that does not draft (one ordinary target step per round), and the methods
that run only in batches (``decoding.batch_size`` above 1: ``pipelines/waves.py``)."""

AUTOREGRESSIVE = "autoregressive"
GOODPUT = "goodput:"  # goodput:<drafter>: the drafter with the batch budget cutting each round's drafts
HF_GENERATE = "hf:generate"  # Hugging Face generate on the same batch: the library's batched greedy decoding
BATCH_ONLY = (GOODPUT, HF_GENERATE)
AGAIN = "again:"  # a method run a second time in the same run (A/A: the noise between two runs of one method)
