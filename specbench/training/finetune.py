"""Fine-tuning a whole Hugging Face drafter (the black-box case) by distillation from its target.

Data: the same sequences as the heads (``distill.Example``: prompt + response, the response
marked). A *row* is one response token: the logits that predict it. For a decoder-only model the
rows of a sequence are positions ``start-1 .. n-2`` of one forward over it; for an
encoder-decoder model the prompt is the encoder input and the rows are the decoder positions of
``[decoder_start] + response[:-1]``. One target forward per sequence (no gradient) gives the
teacher: its top-k next-token probabilities at every row.

Losses over the rows (``loss``):
- ``kl``: cross-entropy against the teacher's top-k probabilities (KL to the target's
  distribution up to the teacher's entropy, restricted to its top k);
- ``ce``: cross-entropy on the sequence's own next tokens (plain fine-tuning; with the target's own
  answers as responses this is sequence-level distillation).

The student is trained in eval mode (no dropout), so training is a function of the data order
alone: seeded, and an interrupted run resumes to the same weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from specbench.training.distill import Example

LOSSES = ("kl", "ce")


@dataclass
class Rows:
    """One sequence ready for training: its ids, where the response starts, the teacher's top-k per row."""

    ids: list[int]
    start: int
    top_ids: torch.Tensor  # [R, k]
    top_p: torch.Tensor  # [R, k]


def _inputs(
    model: nn.Module, exs: list[Example], pad: int
) -> tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batched forward's keywords, the index of each row's logits ``[B, R]``, a row mask ``[B, R]``
    and each row's own next token ``[B, R]`` (right padding; padded rows masked out)."""
    device = next(model.parameters()).device
    enc_dec = bool(getattr(model.config, "is_encoder_decoder", False))
    n_rows = [len(ex.ids) - ex.start for ex in exs]
    width_r = max(n_rows)
    row_mask = torch.tensor([[r < n for r in range(width_r)] for n in n_rows])
    labels = torch.tensor([ex.ids[ex.start :] + [pad] * (width_r - n) for ex, n in zip(exs, n_rows)])

    def padded(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=device)
        return ids, mask

    if enc_dec:
        start = model.config.decoder_start_token_id
        enc, enc_mask = padded([ex.ids[: ex.start] for ex in exs])
        dec, dec_mask = padded([[start] + ex.ids[ex.start : -1] for ex in exs])
        kwargs = {
            "input_ids": enc,
            "attention_mask": enc_mask,
            "decoder_input_ids": dec,
            "decoder_attention_mask": dec_mask,
        }
        index = torch.arange(width_r).expand(len(exs), width_r)
    else:
        ids, mask = padded([ex.ids for ex in exs])
        kwargs = {"input_ids": ids, "attention_mask": mask}
        index = torch.stack([torch.arange(width_r) + ex.start - 1 for ex in exs])
    index = torch.where(row_mask, index, torch.zeros_like(index))
    return kwargs, index.to(device), row_mask.to(device), labels.to(device)


def row_logits(
    model: nn.Module, exs: list[Example], pad: int, **forward
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logits [B, R, V], row mask [B, R], next tokens [B, R])`` of a batch of sequences (``forward``: more
    keywords for the model, e.g. ``full=False`` for a small drafter's sub-vocabulary rows)."""
    kwargs, index, row_mask, labels = _inputs(model, exs, pad)
    logits = model(**kwargs, use_cache=False, **forward).logits
    picked = torch.gather(logits, 1, index[..., None].expand(-1, -1, logits.shape[-1]))
    return picked, row_mask, labels


@torch.inference_mode()
def teach_rows(model: nn.Module, ex: Example, top_k: int, pad: int, vocab_size: int) -> Rows:
    """One target forward over a sequence: the top-k of its next-token distribution at every row."""
    logits, _, _ = row_logits(model, [ex], pad)
    probs = torch.softmax(logits[0, :, :vocab_size].float(), dim=-1)
    top = torch.topk(probs, min(top_k, probs.shape[-1]), dim=-1)
    return Rows(ids=list(ex.ids), start=ex.start, top_ids=top.indices.cpu(), top_p=top.values.cpu())


def batches(items: list[Rows], batch_size: int, generator: torch.Generator):
    """Shuffle the sequences (seeded) into batches of ``batch_size``."""
    order = torch.randperm(len(items), generator=generator).tolist()
    for s in range(0, len(order), batch_size):
        yield [items[i] for i in order[s : s + batch_size]]


def _padded_teacher(batch: list[Rows], width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    k = batch[0].top_ids.shape[1]
    ids = torch.zeros((len(batch), width, k), dtype=torch.long)
    p = torch.zeros((len(batch), width, k))
    for b, it in enumerate(batch):
        ids[b, : len(it.top_ids)] = it.top_ids
        p[b, : len(it.top_p)] = it.top_p
    return ids.to(device), p.to(device)


def loss_of(
    model: nn.Module, batch: list[Rows], loss: str, pad: int, vocab_size: int, t2d: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict]:
    """Mean loss over the rows of a batch, and its statistics (``top1``: argmax agreement with the target's).

    ``t2d`` (target id -> draft sub-vocabulary index, -1 outside it): the model scores its sub-vocabulary only
    (``full=False``, no ``V``-wide rows), and the teacher's ids are mapped into it. Either way, teacher mass and
    labels outside what the model scores (-inf, or -1) are left out."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    exs = [Example(ids=it.ids, start=it.start) for it in batch]
    logits, mask, labels = row_logits(model, exs, pad, **({"full": False} if t2d is not None else {}))
    logq = torch.log_softmax((logits if t2d is not None else logits[..., :vocab_size]).float(), dim=-1)
    top_ids, top_p = _padded_teacher(batch, logits.shape[1], logits.device)
    if t2d is not None:
        t2d = t2d.to(logq.device)
        top_ids, labels = t2d[top_ids], t2d[labels]
    if loss == "kl":
        picked = torch.gather(logq, 2, top_ids.clamp_min(0))
        per_row = -(top_p * picked.masked_fill(torch.isinf(picked) | (top_ids < 0), 0.0)).sum(-1)
    else:
        picked = torch.gather(logq, 2, labels.clamp_min(0)[..., None])[..., 0]
        per_row = -picked.masked_fill(torch.isinf(picked) | (labels < 0), 0.0)
    value = per_row[mask].mean()
    with torch.no_grad():
        top1 = float((logq.argmax(-1) == top_ids[..., 0])[mask].float().mean())
    return value, {"loss": float(value.detach()), "top1": top1}


@torch.inference_mode()
def agreement(model: nn.Module, items: list[Rows], pad: int, vocab_size: int, depth: int = 4) -> dict:
    """Held-out agreement with the target's argmax (teacher-forced), and the chain of it.

    ``top1``: the drafter's argmax equals the target's at a row. ``depth_j``: share of rows where
    this holds for ``j`` rows in a row; on the target's own greedy text the drafter's teacher-forced
    guesses are its own drafts, so ``expected_accepted`` = sum of ``depth_j`` (j = 1 .. ``depth``) is
    the mean accepted draft tokens per round at draft length ``depth`` (an estimate on reference text).
    """
    hits = [0] * depth
    total = 0
    for it in items:
        logits, _, _ = row_logits(model, [Example(ids=it.ids, start=it.start)], pad)
        match = (logits[0, :, :vocab_size].argmax(-1).cpu() == it.top_ids[:, 0]).tolist()
        total += len(match)
        for i in range(len(match)):
            for j in range(depth):
                if i + j >= len(match) or not match[i + j]:
                    break
                hits[j] += 1
    rates = [h / total if total else math.nan for h in hits]
    return {
        "positions": total,
        "top1": rates[0],
        **{f"depth_{j + 1}": r for j, r in enumerate(rates)},
        "expected_accepted": sum(rates) if total else math.nan,
    }
