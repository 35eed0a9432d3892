"""``eagle3``: a feature-level draft head in the EAGLE-3 layout (published EAGLE-3 and vLLM ``speculators`` heads).

The EAGLE-1 head (``eagle``) reads the target's last feature; an EAGLE-3 head reads three target
layers (low, middle, high), fuses them with ``fc`` and drafts with ONE special decoder layer:

- **Fusion**: ``g_t = fc(cat(s_a(t), s_b(t), s_c(t)))`` (``3 * H_target -> H``; no bias in SafeAILab /
  SpecForge / current ``speculators``, a bias in early ``speculators`` files: loaded when present),
  where ``s_l`` is the residual stream after ``l`` target layers (Hugging Face's
  ``output_hidden_states[l]``, index 0 the embeddings) at the aux layer ids. That is the convention of
  the published code: SafeAILab's target records the *input* of decoder layer ``idx`` for
  ``idx in (2, L // 2, L - 3)``, and vLLM's ``eagle_aux_hidden_state_layer_ids`` (default the same) are
  captured before those layers; specbench's ``state_layers`` / ``Query.states(l)`` use the same index.
- **Layer** (the head's first decoder layer): its input is ``cat(embed(x_{t+1}), h)``; the embedding goes
  through ``input_layernorm``, ``h`` through ``hidden_norm``; q/k/v project the ``2H`` concatenation;
  the attention residual is ``h`` (or ``hidden_norm(h)`` with ``norm_before_residual``); then the usual
  Llama MLP block. ``speculators`` heads with more layers add plain Llama decoder layers after it.
- **Drafting**: the first step's ``h`` is ``g_t``; every later step's ``h`` is the layer stack's previous
  output *before* the final norm (fc applies only to the target's features); the draft distribution is
  ``lm_head(norm(h))`` over the head's own draft vocabulary (``lm_head`` ``[draft_vocab, H]``).
- **Vocabulary**: ``d2t`` (int64 offsets: ``target_id = draft_id + d2t[draft_id]``) is converted to
  absolute target ids at load; ``t2d`` (a bool mask over the target vocabulary), when present, must agree.
  Verification stays against the target's full vocabulary; in sampling mode ``q`` is the head's
  distribution placed in the full vocabulary (zero outside the draft vocabulary), so decoding stays lossless.
- **Layouts** (both load without conversion):
  SafeAILab/EAGLE and SpecForge: a Llama ``config.json`` with ``draft_vocab_size`` (architecture
  ``LlamaForCausalLMEagle3``), aux ids optional in ``eagle_config.eagle_aux_hidden_state_layer_ids``
  (or top-level), tensors ``fc.*``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``
  and possibly ``embed_tokens.weight``.
  ``speculators``: ``speculators_model_type: eagle3`` with the layer's Llama config under
  ``transformer_layer_config``, top-level ``draft_vocab_size``, ``norm_before_residual``,
  ``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids``, ``norm_before_fc``; tensors ``fc.*``,
  ``layers.<i>.*``, ``norm.weight``, ``lm_head.weight``, ``embed_tokens.weight``, ``d2t``, ``t2d``
  (``verifier_*`` tensors are ignored), ``input_norm.weight`` with ``norm_before_fc``.
- **Embeddings**: the file's ``embed_tokens`` when it has one (frozen copies of the target's, unless
  trained), else the target's own table.
- **Cache, features, rollback, dtype**: as ``eagle`` (``EagleDrafter``, which this drafter extends): one
  cache position per pair ``(g_t, x_{t+1})``; features come from the decode loop (prefill and every
  verification forward), so there is no second target pass.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated

import torch
from torch import nn

from specbench.decoding.drafter import DecodeContext
from specbench.drafters.base import Checkpoint, Confidence, Dtype, MakeTarget
from specbench.drafters.eagle.eagle1 import EagleDrafter
from specbench.drafters.eagle.eagle3_files import (
    LAYOUT_FIX,
    Fit,
    aux_ids,
    check_fit,
    checkpoint_path,
    draft_vocabulary,
    load_own,
    read_config,
    read_state,
)
from specbench.drafters.eagle.head import HeadLogits, family_config
from specbench.drafters.head_files import resolve_checkpoint
from specbench.errors import SpecbenchError
from specbench.files import files_fingerprint
from specbench.models.cache import cache_argument
from specbench.models.devices import resolve_dtype
from specbench.models.target import Target
from specbench.validate import integer, list_of

# the head's architecture: taken from the checkpoint's config, the target's where the checkpoint is silent
ARCH_KEYS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rms_norm_eps",
    "hidden_act",
    "attention_bias",
    "mlp_bias",
    "max_position_embeddings",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "pretraining_tp",
)


def default_aux_layers(num_layers: int) -> list[int]:
    """The aux layer ids EAGLE-3 uses when a head does not name them (SafeAILab, vLLM, speculators)."""
    return [2, num_layers // 2, num_layers - 3]


def _first_layer_class():
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaModel, LlamaRMSNorm

    try:  # transformers 4.x decoder layers return a tuple (LlamaModel reads ``layer_outputs[0]``), 5.x a tensor
        tuple_out = "layer_outputs[0]" in inspect.getsource(LlamaModel.forward)
    except (OSError, TypeError):
        tuple_out = False

    class Eagle3FirstLayer(LlamaDecoderLayer):
        """A Llama decoder layer whose input is ``cat(embeddings, hidden)`` (``2H``): q/k/v take ``2H``,
        ``hidden_norm`` normalises the hidden half, the residual is the hidden half."""

        def __init__(self, config, layer_idx: int = 0, norm_before_residual: bool = False):
            super().__init__(config, layer_idx)
            hidden, head_dim = int(config.hidden_size), int(config.head_dim)
            bias = bool(getattr(config, "attention_bias", False))
            self.hidden_size = hidden
            self.norm_before_residual = bool(norm_before_residual)
            self.hidden_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
            attn = self.self_attn
            attn.q_proj = nn.Linear(2 * hidden, config.num_attention_heads * head_dim, bias=bias)
            attn.k_proj = nn.Linear(2 * hidden, config.num_key_value_heads * head_dim, bias=bias)
            attn.v_proj = nn.Linear(2 * hidden, config.num_key_value_heads * head_dim, bias=bias)

        def forward(self, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
            embeds, hidden = hidden_states.split(self.hidden_size, dim=-1)
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
            out = self.self_attn(hidden_states=x, **kwargs)
            h = residual + (out[0] if isinstance(out, tuple) else out)
            h = h + self.mlp(self.post_attention_layernorm(h))
            return (h,) if tuple_out else h

    return Eagle3FirstLayer


def layer_config(layer: dict, target_config, layers: int):
    """A ``LlamaConfig`` for the head's layer stack: the checkpoint's architecture keys over the target's,
    no vocabulary of its own (its inputs are embeddings)."""
    from transformers import LlamaConfig

    base = target_config.to_dict()
    merged = {k: base[k] for k in ARCH_KEYS if base.get(k) is not None}
    if any(k in layer for k in ("rope_theta", "rope_scaling", "rope_parameters")):
        for k in ("rope_theta", "rope_scaling", "rope_parameters"):
            merged.pop(k, None)  # the head's own rope settings, not a mix with the target's
    if "hidden_size" in layer and "head_dim" not in layer:
        merged.pop("head_dim", None)
    merged.update({k: v for k, v in layer.items() if k in ARCH_KEYS and v is not None})
    return family_config(LlamaConfig(**merged), layers)


@dataclass(frozen=True)
class Eagle3Layout:
    """What a checkpoint's layout adds to an EAGLE-3 head's architecture: a bias on ``fc`` (early ``speculators``
    files), the attention residual taken after ``hidden_norm`` (``norm_before_residual``), an RMSNorm over the aux
    features before ``fc`` (``norm_before_fc``: ``input_norm``), and the rows of the head's own embedding table
    (``embed_rows``; 0: the target's table is used)."""

    fc_bias: bool = False
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    embed_rows: int = 0


class Eagle3Head(nn.Module):
    """``fc`` + the EAGLE-3 layer stack + ``norm`` + ``lm_head`` (+ ``embed_tokens`` / ``input_norm``).

    ``fuse(aux features [.., k * H_target]) -> [.., H]``; ``forward(hidden, embeddings, cache) -> [B, T, H]``,
    the stack's output before the final norm (the next step's ``hidden``); ``draft_logits(h)`` over the
    draft vocabulary. State dict keys follow ``speculators`` (``layers.0.*``); SafeAILab's ``midlayer.*``
    is mapped onto ``layers.0.*`` at load.
    """

    def __init__(
        self,
        config,
        fc_in: int,
        draft_vocab: int,
        layout: Eagle3Layout = Eagle3Layout(),
        *,
        device=None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaModel, LlamaRMSNorm

        hidden = int(config.hidden_size)
        stack = LlamaModel(config)
        stack.embed_tokens = None
        stack.norm = nn.Identity()
        stack.layers[0] = _first_layer_class()(config, 0, layout.norm_before_residual)
        self.hidden_size = hidden
        self.input_norm = LlamaRMSNorm(fc_in, eps=config.rms_norm_eps) if layout.norm_before_fc else None
        self.fc = nn.Linear(fc_in, hidden, bias=layout.fc_bias)
        self.layers = stack.layers
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, int(draft_vocab), bias=False)
        self.embed_tokens = nn.Embedding(int(layout.embed_rows), hidden) if layout.embed_rows else None
        self._stack = [stack]  # not a submodule: its parameters are ``layers``
        self._cache_kw = cache_argument(stack)
        self.to(dtype=dtype, device=device)
        stack.to(device=device)  # the rotary buffers (float32)

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The concatenated aux features of the target ``[.., k * H_target]`` -> the first step's hidden ``[.., H]``."""
        x = features.to(self.dtype)
        if self.input_norm is not None:
            x = self.input_norm(x)
        return self.fc(x)

    def forward(self, hidden: torch.Tensor, embeddings: torch.Tensor, cache=None) -> torch.Tensor:
        """``hidden`` ``[B, T, H]`` (``g_t``, or the previous step's output), ``embeddings`` ``[B, T, H]``
        (of ``x_{t+1}``) -> ``[B, T, H]`` in the head's dtype, before the final norm."""
        kwargs = {} if cache is None else {self._cache_kw: cache, "use_cache": True}
        return self.stack(inputs_embeds=self.inputs(hidden, embeddings), **kwargs).last_hidden_state

    def inputs(self, hidden: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """What the stack is fed: ``[embed(x_{t+1}), g_t]`` (its first layer takes both), in the head's dtype."""
        return torch.cat([embeddings.to(self.dtype), hidden.to(self.dtype)], dim=-1)

    @property
    def stack(self) -> nn.Module:
        """The layer stack (a base model fed ``inputs_embeds``; a batch drafts through it, ``drafters/batched.py``)."""
        return self._stack[0]

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h.to(self.dtype)))


class DraftVocabLogits(HeadLogits):
    """The head's own LM head over its draft vocabulary (``d2t``: the target ids of its rows), with
    ``HeadLogits``'s interface (``__call__``, ``to_full``, ``d2t``, ``vocab_size``, ``weight``)."""

    def __init__(self, head: Eagle3Head, d2t: torch.Tensor | None, vocab_size: int):
        self.head = head
        self.d2t = d2t
        self.vocab_size = int(vocab_size)
        self.weight = head.lm_head.weight
        self.bias = None

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` -> float32 logits ``[..., N]`` (draft vocabulary) or ``[..., V]`` (no ``d2t``)."""
        logits = self.head.draft_logits(h).float()
        return logits if self.d2t is not None else logits[..., : self.vocab_size]


class Eagle3Drafter(EagleDrafter):
    """``EagleDrafter`` with EAGLE-3's inputs and outputs: ``state_layers`` are the aux layers, the first
    step's hidden is ``fc`` of their concatenation, and the head scores its own draft vocabulary.
    Drafting (``propose``), replay and side observations are ``EagleDrafter``'s."""

    def __init__(
        self,
        name: str,
        head: Eagle3Head,
        target: Target,
        d2t: torch.Tensor | None,
        aux_layers: list[int],
        cost: float,
        confidence_threshold: float = 0.0,
    ):
        super().__init__(name, head, target, None, cost, confidence_threshold)  # d2t=None: no row copy
        self.logits = DraftVocabLogits(head, d2t, target.vocab_size)
        if head.embed_tokens is not None:
            self.embed = head.embed_tokens
        self.aux = [int(a) for a in aux_layers]

    def state_layers(self, side_observations: bool) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.aux))

    def features(self, query: DecodeContext, start: int, stop: int) -> torch.Tensor:
        """``fc`` of the aux layers' features, concatenated (low, mid, high), at ``query``'s positions
        ``start .. stop-1``."""
        return self.head.fuse(torch.cat([query.states(layer)[start:stop] for layer in self.aux], dim=-1))


def load_eagle3(
    checkpoint: str,
    target: Target,
    make_target: str | None = None,
    dtype: torch.dtype | None = None,
    aux_layers: list[int] | None = None,
):
    """``(Eagle3Head, d2t (absolute target ids) | None, aux_layer_ids)`` from an EAGLE-3 or speculators
    eagle3 checkpoint (directory or hub id), checked against ``target``; the head in ``dtype`` (None: the
    target's). ``aux_layers`` overrides the checkpoint's aux layer ids."""
    path = checkpoint_path(checkpoint, make_target)
    config = read_config(path)
    state, layer, layer_ids = read_state(path, config)
    n_layers = int(target.config.num_hidden_layers)
    aux = (
        [int(a) for a in aux_layers]
        if aux_layers
        else (aux_ids(config, layer) or default_aux_layers(n_layers))
    )
    bad = [a for a in aux if not 0 <= a <= n_layers]
    if bad:
        raise SpecbenchError(
            f"draft head {path}: aux layer ids {aux} are out of range for this target's "
            f"{n_layers} layers (0 .. {n_layers}: the residual stream after that many layers)",
            "use a head trained for this target, or set the drafter's aux_layers",
        )
    fit = check_fit(path, config, dict(layer), state, target, aux)
    d2t = draft_vocabulary(path, state, fit.draft_vocab, target.vocab_size)
    device = next(target.model.parameters()).device
    head = _build_head(path, config, state, fit, target, max(layer_ids) + 1, dtype)
    load_own(head, state, path)
    return head.eval(), (None if d2t is None else d2t.to(device)), aux


def _build_head(path, config: dict, state: dict, fit: Fit, target: Target, layers: int, dtype) -> Eagle3Head:
    """An empty ``Eagle3Head`` of ``layers`` decoder layers in the checkpoint's layout (``fit``: what ``check_fit``
    found) on the target's device (``dtype``: None, the target's)."""
    device = next(target.model.parameters()).device
    fc = state["fc.weight"]
    try:
        cfg = layer_config(fit.layer, target.config, layers)
        layout = Eagle3Layout(
            fc_bias="fc.bias" in state,
            norm_before_residual=bool(config.get("norm_before_residual", False)),
            norm_before_fc=bool(config.get("norm_before_fc", False)) or "input_norm.weight" in state,
            embed_rows=0 if fit.embed is None else int(fit.embed.shape[0]),
        )
        return Eagle3Head(
            cfg,
            int(fc.shape[1]),
            fit.draft_vocab,
            layout,
            device=device,
            dtype=dtype or next(target.model.parameters()).dtype,
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise SpecbenchError(
            f"draft head {path}: its config does not describe a Llama-style EAGLE-3 layer "
            f"({type(exc).__name__}: {str(exc)[:200]})",
            LAYOUT_FIX,
        ) from exc


def head_cost(head: Eagle3Head, target: Target) -> float:
    """Parameters touched per draft token (fc, layers, norms, lm_head; not the embedding lookup) / the target's."""
    own = sum(p.numel() for n, p in head.named_parameters() if not n.startswith("embed_tokens."))
    return own / sum(p.numel() for p in target.model.parameters())


def build(
    target: Target,
    name: str,
    checkpoint: Checkpoint = None,
    make_target: MakeTarget = None,
    confidence_threshold: Confidence = 0.0,
    dtype: Dtype = None,
    aux_layers: Annotated[
        list[int] | None, list_of(integer(0), null=True)
    ] = None,  # the target layers it reads
) -> Eagle3Drafter:
    """An EAGLE-3 head as a drafter. ``aux_layers``: the target layers it reads (null: the checkpoint's, else
    EAGLE-3's default ``[2, L // 2, L - 3]``); ``dtype``: the head's (null: the target's);
    ``confidence_threshold``: a dynamic draft length. There is no ``sub_vocabulary`` key (``eagle``'s): the head's
    LM head only has rows for its own draft vocabulary."""
    if target.is_encoder_decoder:
        raise SpecbenchError(
            f"drafter '{name}' (eagle3) needs a decoder-only, Llama-style target",
            "use early_exit, quantized or an hf drafter with encoder-decoder targets",
        )
    if not all(hasattr(target.config, k) for k in ("hidden_size", "num_hidden_layers")):
        raise SpecbenchError(
            f"drafter '{name}' (eagle3) needs a Llama-style target (hidden_size, "
            f"num_hidden_layers); {target.loaded.name} has neither",
            "use another drafter kind with this target",
        )
    if not checkpoint:
        raise SpecbenchError(
            f"drafter '{name}' (eagle3) has no checkpoint",
            "set its checkpoint to an EAGLE-3 or speculators eagle3 head (directory or hub id)",
        )
    head_dtype = resolve_dtype(dtype, target.device) if dtype else None
    head, d2t, aux = load_eagle3(checkpoint, target, make_target, dtype=head_dtype, aux_layers=aux_layers)
    drafter = Eagle3Drafter(name, head, target, d2t, aux, cost=0.0, confidence_threshold=confidence_threshold)
    drafter.cost = head_cost(head, target)
    drafter.fingerprint = files_fingerprint(
        resolve_checkpoint(checkpoint, make_target)
    )  # any source: resumes check it
    return drafter


build.batches = (
    "chains"  # one head forward a position for a batch's rows, as the eagle kind (EagleDrafter.cohort)
)

__all__ = ["Eagle3Drafter", "Eagle3Head", "Eagle3Layout", "build", "default_aux_layers", "load_eagle3"]
