"""Drafter training, the parts ``specbench train-drafter`` runs: the trainees (``HeadTrainee``:
a feature-level draft head, ``training/distill.py``; ``ModelTrainee``: an existing small model,
``training/finetune.py``), each with its teacher pass, batches, loss and save, and the held-out metrics
(agreement with the target by draft depth on every task of ``eval_sets``). The settings and the training sequences
they learn from are ``training/recipe.py``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from specbench.drafters.eagle.head import EagleHead, HeadLogits
from specbench.drafters.head_files import save_head
from specbench.drafters.hf import MODEL_META, check_compatible
from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text, plain_modes
from specbench.models import Target, load_model
from specbench.tasks import truncate_fields
from specbench.tasks.datasets import load_source
from specbench.training import distill, finetune
from specbench.training.distill import Example, pairs, sub_vocabulary, teach_all
from specbench.training.recipe import autocast, examples_of, training_precision
from specbench.training.responses import response_cache, target_responses

log = logging.getLogger(__name__)


class HeadTrainee:
    """``drafter.kind=eagle``: a feature-level head from scratch (``training/distill.py``)."""

    kind = "eagle"
    default_lr = 1e-3

    def __init__(self, cfg: DictConfig, target: Target, train_ex: list[Example], eos: frozenset[int]):
        if target.is_encoder_decoder:
            raise SpecbenchError(
                "eagle heads need a decoder-only target",
                "pick a decoder-only target, or drafter.kind=hf for an encoder-decoder one",
            )
        if str(cfg.train.loss) != "kl":
            raise SpecbenchError(
                f"train.loss={cfg.train.loss} is for whole-model drafters (drafter.kind=hf)",
                "use train.loss=kl with eagle heads (ce_weight / feature_weight weigh their terms)",
            )
        tr = cfg.train
        self.tr = tr
        self.target = target
        self.d2t = sub_vocabulary(train_ex, cfg.drafter.get("vocab"), target.vocab_size, always=sorted(eos))
        self.t2d = None
        if self.d2t is not None:
            self.t2d = torch.full((target.vocab_size,), -1, dtype=torch.long)
            self.t2d[self.d2t] = torch.arange(len(self.d2t))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(tr.seed))
            self.module = EagleHead(target.model, layers=int(cfg.drafter.layers), dtype=torch.float32)
        # Trained in float32 whatever the target's dtype: the LM-head rows as a float32 copy (the
        # teacher's features and probabilities are float32 already, its embeddings are cast).
        self.logits = HeadLogits(target, self.d2t, dtype=torch.float32)
        self.embed = target.model.get_input_embeddings()
        self.unroll = int(tr.get("unroll") or 1)
        weights = tr.get("unroll_weights")
        self.unroll_weights = None if weights is None else [float(w) for w in weights]
        if self.unroll_weights is not None and len(self.unroll_weights) != self.unroll:
            raise SpecbenchError(
                f"train.unroll_weights has {len(self.unroll_weights)} entries, train.unroll is {self.unroll}",
                "give one weight per unroll step, or train.unroll_weights=null (equal weights)",
            )
        self.feature_noise = float(tr.get("feature_noise") or 0.0)
        self.noise_gen: torch.Generator | None = None
        self.precision = training_precision(cfg)
        self.meta = {
            "layers": int(cfg.drafter.layers),
            "sub_vocabulary": None if self.d2t is None else int(len(self.d2t)),
            "unroll": self.unroll,
            "unroll_weights": self.unroll_weights,
            "feature_noise": self.feature_noise,
            "precision": self.precision,
        }

    def items(self, examples: list[Example], desc: str, response_only: bool = False) -> list[dict]:
        with tqdm(total=len(examples), desc=desc, unit="seq") as bar:
            teachers = teach_all(self.target.model, examples, int(self.tr.top_k), progress=bar)
        return [pairs(ex, t, response_only) for ex, t in zip(examples, teachers)]

    def batches(self, items: list[dict], gen: torch.Generator):
        return distill.batches(items, int(self.tr.batch_size), int(self.tr.seq_len), gen)

    def whole(self, items: list[dict]):
        return next(
            distill.batches(items, len(items), int(self.tr.seq_len), torch.Generator().manual_seed(0))
        )

    def start_epoch(self, seed: int, epoch: int) -> None:
        """The feature noise of an epoch is a function of (seed, epoch): a resumed run draws the same."""
        self.noise_gen = (
            torch.Generator().manual_seed(seed * 1_000 + epoch + 7_919) if self.feature_noise else None
        )

    def loss(self, batch, training: bool = True):
        with autocast(self.precision, self.target.device):
            spec = distill.LossSpec(
                float(self.tr.feature_weight),
                float(self.tr.ce_weight),
                unroll=self.unroll,
                unroll_weights=self.unroll_weights,
                feature_noise=self.feature_noise if training else 0.0,
            )
            return distill.loss_of(
                self.module, self.embed, self.logits, batch, spec, self.t2d, self.noise_gen
            )

    def agreement(self, items: list[dict]) -> dict:
        return distill.agreement(self.module, self.embed, self.logits, items, depth=4, max_depth=5)

    def save(self, path: Path, meta: dict) -> None:
        save_head(self.module, self.d2t, path, meta)


class ModelTrainee:
    """``drafter.kind=hf``: an existing small causal or seq2seq model, fine-tuned (``training/finetune.py``)."""

    kind = "hf"
    default_lr = 5e-5

    def __init__(self, cfg: DictConfig, target: Target, train_ex: list[Example], eos: frozenset[int]):
        if not cfg.drafter.get("model"):
            raise SpecbenchError(
                "train-drafter drafter.kind=hf needs the model to fine-tune",
                "set drafter.model=<hub id, local directory or embedded:...> "
                "(e.g. double7/vicuna-68m for Vicuna, t5-small for T5)",
            )
        if str(cfg.train.loss) not in finetune.LOSSES:
            raise SpecbenchError(
                f"train.loss must be one of {', '.join(finetune.LOSSES)}, got '{cfg.train.loss}'",
                "kl: to the target's top-k distribution; ce: to the text's next tokens",
            )
        self.tr = cfg.train
        self.target = target
        # Trained in float32 whatever the target's dtype (the teacher's probabilities are float32).
        loaded = load_model(str(cfg.drafter.model), dtype="float32", device=str(target.device))
        check_compatible(target, loaded, str(cfg.drafter.model))
        self.loaded = loaded
        self.module = (
            loaded.model.eval()
        )  # eval mode: no dropout, so training is a function of the data order
        self.module.requires_grad_(True)
        tok = target.tokenizer
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
        self.meta = {
            "base_model": str(cfg.drafter.model),
            "loss": str(cfg.train.loss),
            "encoder_decoder": target.is_encoder_decoder,
        }
        if (
            int(self.tr.get("unroll") or 1) != 1
            or float(self.tr.get("feature_noise") or 0.0)
            or self.tr.get("prompt_positions")
        ):
            raise SpecbenchError(
                "train.unroll, train.feature_noise and train.prompt_positions are for eagle heads "
                "(drafter.kind=eagle)",
                "leave train.unroll=1, train.feature_noise=0 and "
                "train.prompt_positions=false with drafter.kind=hf",
            )
        self.precision = training_precision(cfg)

    def start_epoch(self, seed: int, epoch: int) -> None:
        pass

    def items(self, examples: list[Example], desc: str, response_only: bool = False) -> list[finetune.Rows]:
        return [
            finetune.teach_rows(self.target.model, ex, int(self.tr.top_k), self.pad, self.target.vocab_size)
            for ex in tqdm(examples, desc=desc, unit="seq")
        ]

    def batches(self, items, gen: torch.Generator):
        return finetune.batches(items, int(self.tr.batch_size), gen)

    def whole(self, items):
        return items

    def loss(self, batch, training: bool = True):
        with autocast(self.precision, self.target.device):
            return finetune.loss_of(self.module, batch, str(self.tr.loss), self.pad, self.target.vocab_size)

    def agreement(self, items) -> dict:
        return finetune.agreement(self.module, items, self.pad, self.target.vocab_size, depth=4)

    def save(self, path: Path, meta: dict) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.module.save_pretrained(path)
        self.loaded.tokenizer.save_pretrained(path)
        atomic_write_text(path / MODEL_META, json.dumps(meta, indent=1, default=str))
        plain_modes(path)  # the library's writers may leave 0600


class SmallTrainee(ModelTrainee):
    """``drafter.kind=small``: a standalone small drafter made from the target (``drafters/small.py``): its first
    ``drafter.layers`` layers and final norm, copied and fine-tuned, on the target's LM head restricted to a
    ``drafter.vocab`` sub-vocabulary (the most frequent answer tokens); the embedding stays the target's, frozen.
    Trained on the response rows like an hf drafter (``train.loss``: kl to the target's top-k, or ce)."""

    kind = "small"
    default_lr = 3e-4

    def __init__(self, cfg: DictConfig, target: Target, train_ex: list[Example], eos: frozenset[int]):
        from specbench.drafters.small import SmallLM

        if str(cfg.train.loss) not in finetune.LOSSES:
            raise SpecbenchError(
                f"train.loss must be one of {', '.join(finetune.LOSSES)}, got '{cfg.train.loss}'",
                "kl: to the target's top-k distribution; ce: to the text's next tokens",
            )
        if (
            int(cfg.train.get("unroll") or 1) != 1
            or float(cfg.train.get("feature_noise") or 0.0)
            or cfg.train.get("prompt_positions")
        ):
            raise SpecbenchError(
                "train.unroll, train.feature_noise and train.prompt_positions are for eagle heads "
                "(drafter.kind=eagle)",
                "leave train.unroll=1, train.feature_noise=0 and "
                "train.prompt_positions=false with drafter.kind=small",
            )
        self.tr = cfg.train
        self.target = target
        d2t = sub_vocabulary(train_ex, cfg.drafter.get("vocab"), target.vocab_size, always=sorted(eos))
        layers_key = str(cfg.target.get("layers_key") or "num_hidden_layers")
        self.module = SmallLM(target, int(cfg.drafter.layers), d2t, layers_key, dtype=torch.float32).eval()
        for name, p in self.module.named_parameters():
            p.requires_grad_(name.startswith(tuple(f"stack.{o}" for o in ("layers.", "norm."))))
        tok = target.tokenizer
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
        self.precision = training_precision(cfg)
        self.meta = {
            "layers": int(cfg.drafter.layers),
            "sub_vocabulary": None if d2t is None else int(len(d2t)),
            "loss": str(cfg.train.loss),
            "precision": self.precision,
        }
        self.t2d = None
        if d2t is not None:  # target id -> sub-vocabulary index (-1: outside it)
            self.t2d = torch.full((target.vocab_size,), -1, dtype=torch.long)
            self.t2d[d2t] = torch.arange(len(d2t))

    def loss(self, batch, training: bool = True):
        """``finetune.loss_of`` over the sub-vocabulary (no ``V``-wide rows)."""
        with autocast(self.precision, self.target.device):
            return finetune.loss_of(
                self.module, batch, str(self.tr.loss), self.pad, self.target.vocab_size, self.t2d
            )

    def save(self, path: Path, meta: dict) -> None:
        from specbench.drafters.small import save

        save(self.module, path, meta)


TRAINEES = {t.kind: t for t in (HeadTrainee, ModelTrainee, SmallTrainee)}


def held_out_metrics(cfg, trainee, target, prompter, tok, ckpt: Path, eos, val_items=None) -> dict:
    """Agreement on each held-out set, on the same kind of text the head trained on (references, or
    the target's own answers, generated once and kept in ``heldout_<task>.jsonl``); ``validation``:
    on the training split's held-out rows (``train.val_examples``, the head's own task), by draft depth."""
    tasks = {}
    for task, src in (cfg.get("eval_sets") or {}).items():
        if src is None:
            continue
        src = OmegaConf.to_container(src, resolve=True)
        limit, offset = src.pop("limit", 8), src.pop("offset", 0)
        try:
            queries = load_source(
                task, src, limit=limit, offset=offset, shuffle=bool(src.pop("shuffle", False))
            )
        except SpecbenchError as exc:
            log.warning("held-out set %s skipped: %s", task, exc.problem)
            continue
        queries = [
            truncate_fields(q, tok, cfg.train.get("max_input_tokens") or cfg.dataset.get("max_input_tokens"))
            for q in queries
        ]
        if str(cfg.train.responses) == "target":
            responses = target_responses(
                target,
                prompter,
                queries,
                response_cache(target),
                int(cfg.train.max_new_tokens),
                eos,
                int(cfg.train.get("generate_batch") or 32),
            )
        else:
            responses, queries = None, [q for q in queries if q.reference]
        ex = examples_of(queries, prompter, tok, responses, int(cfg.train.max_tokens))
        tasks[task] = trainee.agreement(trainee.items(ex, f"held out ({task})"))
    out = {"head": ckpt.name, "responses": str(cfg.train.responses), "tasks": tasks}
    if val_items:
        out["validation"] = trainee.agreement(val_items)
    if trainee.kind == "eagle":
        out["definitions"] = {
            **distill.DEPTH_DEFINITIONS,
            "validation": "the training split's held-out rows (train.val_examples, never trained "
            "on): the head's own task",
            "tasks": "the eval_sets rows, per task",
            "target token": "the teacher's greedy (argmax) token at each position of the text "
            f"(train.responses={cfg.train.responses})",
        }
    return out
