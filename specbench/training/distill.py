"""Training a feature-level draft head by self-distillation from its target (pure training math).

Data: token sequences (prompt + response), the response positions marked. One target forward
per sequence (no gradient) gives its last-layer features ``F`` (what the loop hands the head at
decode time) and the target's next-token distribution at every position, kept as its top-k
(``Teacher``). The head learns, at each pair ``(F[t], x[t+1])``, to predict ``F[t+1]`` (smooth-L1)
and the target's distribution of ``x[t+2]`` (cross-entropy against the teacher's top-k, over the
draft vocabulary), on response positions. Everything is seeded and runs on one device; a
checkpoint after every epoch lets an interrupted run resume to the same weights.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from specbench.drafters.eagle.head import EagleHead, HeadLogits


@dataclass
class Example:
    ids: list[int]  # prompt + response token ids
    start: int  # index of the first response token
    learn: int | None = None  # index of the first token the head learns to predict (None: ``start``)


@dataclass
class Teacher:
    """What the target computed for one sequence: features ``[T, H]`` and top-k next-token probabilities."""

    features: torch.Tensor
    top_ids: torch.Tensor  # [T, k]
    top_p: torch.Tensor  # [T, k]


def teach(model: nn.Module, ex: Example, top_k: int = 32) -> Teacher:
    """One target forward over the sequence: last-layer features and the top-k of its distributions."""
    return teach_all(model, [ex], top_k)[0]


@torch.inference_mode()
def teach_all(
    model: nn.Module, examples: Sequence[Example], top_k: int = 32, max_tokens: int = 1024, progress=None
) -> list[Teacher]:
    """:func:`teach` for many sequences, batched: sorted by length, right-padded into batches of at most
    ``max_tokens`` positions, one target forward per batch. A causal decoder's position ``i`` sees only
    positions ``<= i``, so the padding after a sequence changes none of its rows (in bf16 a row's rounding
    may depend on its batch, as in the batched answers; these are training targets). In the input order."""
    device = next(model.parameters()).device
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].ids))
    out: list[Teacher | None] = [None] * len(examples)
    s = 0
    while s < len(order):
        e = s + 1  # the longest sequence of a batch is its last: grow while the padded batch fits
        while e < len(order) and len(examples[order[e]].ids) * (e + 1 - s) <= max_tokens:
            e += 1
        chunk = [examples[i] for i in order[s:e]]
        width = len(chunk[-1].ids)
        x = torch.tensor([ex.ids + [ex.ids[-1]] * (width - len(ex.ids)) for ex in chunk], device=device)
        res = model(input_ids=x, output_hidden_states=True, use_cache=False)
        # The top-k of the whole batch at once, as probabilities exp(logit - logsumexp): no per-sequence
        # [T, vocab] temporaries (with the small kept tensors between them, growing ones fragment the heap).
        logits = res.logits.float()
        top = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1)
        top_p = (top.values - torch.logsumexp(logits, dim=-1, keepdim=True)).exp()
        del logits
        feats = res.hidden_states[-1]
        for j, (i, ex) in enumerate(zip(order[s:e], chunk)):
            n = len(ex.ids)
            out[i] = Teacher(
                features=feats[j, :n].float().cpu().clone(),
                top_ids=top.indices[j, :n].cpu().clone(),
                top_p=top_p[j, :n].cpu().clone(),
            )
        del res, feats, top, top_p
        if progress is not None:
            progress.update(e - s)
        s = e
    return out


def sub_vocabulary(
    examples: Sequence[Example], size: int | None, vocab_size: int, always: Sequence[int] = ()
):
    """The ``size`` most frequent response token ids (plus ``always``, e.g. EOS), sorted; None for the full vocabulary."""
    if not size or size >= vocab_size:
        return None
    counts = Counter(t for ex in examples for t in ex.ids[ex.start :])
    keep = list(dict.fromkeys([*always, *(t for t, _ in counts.most_common())]))[:size]
    if len(keep) < size:  # pad with the lowest unused ids so the size is what was asked
        rest = (i for i in range(vocab_size) if i not in set(keep))
        keep += [next(rest) for _ in range(size - len(keep))]
    return torch.tensor(sorted(keep), dtype=torch.long)


def pairs(ex: Example, t: Teacher, response_only: bool = False) -> dict[str, torch.Tensor]:
    """Training pairs of one sequence: inputs ``(F[i], x[i+1])``, targets ``F[i+1]`` and the teacher at
    ``i+1``, for ``i = 0 .. T-2``; ``mask`` marks pairs that predict a learned token ``x[i+2]``: from
    ``ex.learn`` on (a response token, or a prompt token past the prompts' shared template when
    prompt positions are learned), or from ``ex.start`` with ``response_only`` (held-out scores)."""
    n = len(ex.ids)
    i = torch.arange(n - 1)
    first = ex.start if response_only or ex.learn is None else ex.learn
    return {
        "feat": t.features[:-1],
        "tok": torch.tensor(ex.ids[1:]),
        "next": t.features[1:],
        "top_ids": t.top_ids[1:],
        "top_p": t.top_p[1:],
        "mask": (i + 2 >= first) & (i + 2 < n + 1),
    }


def shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of the prompts (the chat template's fixed opening)."""
    if not prompts:
        return 0
    first, n = prompts[0], min(len(p) for p in prompts)
    for j in range(n):
        if any(p[j] != first[j] for p in prompts):
            return j
    return n


@dataclass(frozen=True)
class LossSpec:
    """The weights of a head's loss: smooth-L1 on the next feature (``feature_weight``) plus cross-entropy to the
    target's top-k (``ce_weight``); ``unroll`` steps weighted by ``unroll_weights``; ``feature_noise`` (see
    ``loss_of``)."""

    feature_weight: float
    ce_weight: float
    unroll: int = 1
    unroll_weights: Sequence[float] | None = None
    feature_noise: float = 0.0


def loss_of(
    head: EagleHead,
    embed: nn.Module,
    logits: HeadLogits,
    batch: dict,
    spec: LossSpec,
    t2d: torch.Tensor | None = None,
    noise_gen: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict]:
    """Mean loss over the masked pairs of a batch ``[B, T]`` (one causal sequence per row).

    ``unroll`` > 1 (EAGLE-3's training-time test, over whole sequences): step 1 feeds the target's
    features ``F[t]`` and predicts ``F̂[t+1]``; step ``j`` > 1 feeds, at pair ``t``, the head's own
    previous prediction ``F̂[t]`` (made at pair ``t-1`` of step ``j-1``) in place of ``F[t]``, with the
    same ground-truth token ``x[t+1]`` and the same targets, so step ``j`` scores predictions made on
    ``j-1`` of the head's own features; pairs whose chain would reach before the sequence start
    (``t < j-1``) are not scored at step ``j``. One causal forward per step (no KV cache); the chain
    is differentiated through. The loss is ``sum_j w_j * loss_j`` (``unroll_weights``, None: all 1).
    ``feature_noise`` > 0: uniform noise in ``[-s, s)`` (EAGLE-1) added to every step's input
    features (drawn from ``noise_gen``). With ``unroll=1`` and no noise this is the one-step loss.
    """
    feature_weight, ce_weight, unroll, feature_noise = (
        spec.feature_weight,
        spec.ce_weight,
        spec.unroll,
        spec.feature_noise,
    )
    with torch.no_grad():
        emb = embed(batch["tok"])
    weights = [1.0] * unroll if spec.unroll_weights is None else [float(w) for w in spec.unroll_weights]
    if len(weights) != unroll:
        raise ValueError(f"unroll_weights has {len(weights)} entries for unroll={unroll}")
    feat, total, stats = batch["feat"], None, {}
    for step in range(unroll):
        if feature_noise > 0:
            feat = (
                feat + (torch.rand(feat.shape, generator=noise_gen, dtype=feat.dtype) * 2 - 1) * feature_noise
            )
        hat = head(feat, emb)
        m = batch["mask"]
        if step:
            m = m.clone()
            m[:, :step] = False
        loss, s = _step_loss(hat, m, logits, batch, feature_weight, ce_weight, t2d)
        term = loss if weights[step] == 1.0 else weights[step] * loss
        total = term if total is None else total + term
        if step == 0:
            stats = s
        else:
            stats.update({f"{k}_{step + 1}": v for k, v in s.items() if k != "loss"})
        if step + 1 < unroll:  # the next step's inputs: own predictions, shifted one pair right
            feat = torch.cat([batch["feat"][:, :1], hat[:, :-1]], dim=1)
    return total, {**stats, "loss": float(total.detach())}


def _step_loss(hat, m, logits, batch, feature_weight, ce_weight, t2d):
    reg = nn.functional.smooth_l1_loss(hat[m].float(), batch["next"][m])
    logq = torch.log_softmax(logits(hat[m]).float(), dim=-1)  # [M, N] (float32 under bf16 autocast too)
    ids, p = batch["top_ids"][m], batch["top_p"][m]
    if t2d is not None:  # target id -> draft index (-1 outside the sub-vocabulary)
        idx = t2d[ids]
        inside = idx >= 0
        picked = torch.gather(logq, 1, idx.clamp(min=0)) * inside
        p = p * inside
    else:
        picked = torch.gather(logq, 1, ids)
    ce = -(p * picked).sum(-1).mean()
    loss = feature_weight * reg + ce_weight * ce
    with torch.no_grad():
        agree = float((ids[:, 0] == draft_argmax(logq, logits)).float().mean())
    return loss, {
        "loss": float(loss.detach()),
        "feature": float(reg.detach()),
        "ce": float(ce.detach()),
        "top1": agree,
    }


def draft_argmax(logq: torch.Tensor, logits: HeadLogits) -> torch.Tensor:
    best = logq.argmax(-1)
    return logits.d2t[best] if logits.d2t is not None else best


def batches(items: list[dict], batch_size: int, seq_len: int, generator: torch.Generator):
    """Shuffle the sequences (seeded), cut each to ``seq_len`` pairs, pad to a batch ``[B, T]``."""
    order = torch.randperm(len(items), generator=generator).tolist()
    for s in range(0, len(order), batch_size):
        chunk = [items[i] for i in order[s : s + batch_size]]
        n = max(min(len(c["tok"]), seq_len) for c in chunk)
        out = {}
        for key in chunk[0]:
            rows = []
            for c in chunk:
                v = c[key][:seq_len]
                pad = n - v.shape[0]
                if pad:
                    v = torch.cat([v, torch.zeros((pad, *v.shape[1:]), dtype=v.dtype)])
                rows.append(v)
            out[key] = torch.stack(rows)
        yield out


DEPTH_DEFINITIONS = {
    "top1_by_depth": "conditional: entry d-1 is, among held-out positions whose drafts at depths 1..d-1 all "
    "agreed with the target's token, the share whose depth-d draft agrees too (drafting on the "
    "head's own predicted features and tokens after the true prefix)",
    "accept_by_depth": "unconditional: entry d-1 is the share of held-out positions whose first d drafts all "
    "agree with the target's tokens (the chance that at least d drafts are accepted)",
    "positions_by_depth": "held-out positions with a target token at depth d (the denominators of accept_by_depth)",
    "depth_j": "share of all held-out positions whose first j drafts all agree (a chain past the text's end "
    "counts as a miss); expected_accepted = sum of depth_1..depth_4",
}


@torch.inference_mode()
def agreement(
    head: EagleHead,
    embed: nn.Module,
    logits: HeadLogits,
    items: list[dict],
    depth: int = 4,
    max_depth: int = 5,
) -> dict:
    """Held-out agreement with the target's argmax, teacher-forced and when drafting on its own features.

    ``top1``: the head's argmax equals the target's at response positions, given the target's true
    features (depth 1). ``depth_j``: share of positions where the first ``j`` drafts, each made on
    the head's own predicted features, all equal the target's argmax along the text (a chain stops
    at its first miss). ``expected_accepted`` = sum of ``depth_j`` for j = 1 .. ``depth``: the mean
    accepted draft tokens per round at draft length ``depth`` when the text is the target's own greedy
    output (for reference text, an estimate). ``top1_by_depth`` / ``accept_by_depth`` (lists, depths
    1 .. ``max_depth``): conditional / unconditional agreement by draft depth (``DEPTH_DEFINITIONS``),
    over the positions that have a target token at that depth.
    """
    far = max(depth, max_depth)
    hits = [0] * far  # chains whose first j+1 drafts agree
    room = [0] * far  # positions with a target token at depth j+1
    tried = [0] * far  # chains that agreed at depths 1..j and have a target token at depth j+1
    total = 0
    for it in items:
        counts = item_agreement(head, embed, logits, it, far)
        for tally, more in zip((hits, room, tried), counts[:3]):
            for j, x in enumerate(more):
                tally[j] += x
        total += counts[3]
    rates = [h / total if total else math.nan for h in hits[:depth]]
    cond = [hits[j] / tried[j] if tried[j] else None for j in range(max_depth)]  # None: no chain got there
    accept = [hits[j] / room[j] if room[j] else None for j in range(max_depth)]
    return {
        "positions": total,
        "top1": rates[0],
        **{f"depth_{j + 1}": r for j, r in enumerate(rates)},
        "expected_accepted": sum(rates) if total else math.nan,
        "top1_by_depth": cond,
        "accept_by_depth": accept,
        "positions_by_depth": room[:max_depth],
    }


def item_agreement(head: EagleHead, embed: nn.Module, logits: HeadLogits, it: dict, far: int):
    """One text's counts for ``agreement``, per depth 1 .. ``far``: chains that agree (hits), positions with a target
    token there (room), chains tried there; and its response positions. Depth 1 drafts every position at once on
    the target's features; deeper drafts feed (own feature, own token) pairs after the true prefix."""
    from transformers import DynamicCache

    hits, room, tried = [0] * far, [0] * far, [0] * far
    feat, tok, top, mask = it["feat"], it["tok"], it["top_ids"][:, 0], it["mask"]
    n = feat.shape[0]
    starts = [i for i in range(n) if bool(mask[i])]
    if not starts:
        return hits, room, tried, 0
    emb = embed(tok[None])
    hat = head(feat[None], emb)[0]  # depth 1 for every position at once
    first = draft_argmax(torch.log_softmax(logits(hat), -1), logits)
    for i in starts:
        tried[0] += 1
        for j in range(far):
            room[j] += i + j < n
        if int(first[i]) != int(top[i]):
            continue
        hits[0] += 1
        h, prev = hat[i], int(first[i])
        cache = DynamicCache()
        head(feat[None, : i + 1], emb[:, : i + 1], cache)
        for j in range(1, far):
            if i + j >= n:
                break
            tried[j] += 1
            h = head(h[None, None], embed(torch.tensor([[prev]])), cache)[0, -1]
            guess = int(draft_argmax(torch.log_softmax(logits(h), -1), logits))
            if guess != int(top[i + j]):
                break
            hits[j] += 1
            prev = guess
    return hits, room, tried, len(starts)
