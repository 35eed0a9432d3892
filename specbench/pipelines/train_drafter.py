"""``specbench train-drafter``: a drafter for a given target, trained by distillation from that target.

Data: ``dataset`` (a training split), teacher-forced: prompt (built as ``eval`` builds it) plus the
reference response (``train.responses=reference``, the default) or the target's own greedy
response (``train.responses=target``: batched greedy ``generate``, appended to ``responses.jsonl``
as it goes and reused on a rerun). One target forward per sequence gives the teacher. Two kinds:

- ``drafter.kind=eagle``: a feature-level head from scratch (EAGLE-1 layout, ``drafter.layers``
  decoder layers, ``drafter.vocab`` draft sub-vocabulary), trained on the response positions with
  smooth-L1 on the next feature plus cross-entropy to the target's top-k distribution
  (``training/distill.py``); ``train.unroll`` > 1 also trains it on its own predicted features
  (EAGLE-3's training-time test, a loss per step weighted by ``train.unroll_weights``), and
  ``train.feature_noise`` adds uniform noise to its input features while training (EAGLE-1);
- ``drafter.kind=hf``: an existing small causal or seq2seq model (``drafter.model``) sharing the
  target's tokenizer, fine-tuned on the response tokens with ``train.loss`` = ``kl`` (to the
  target's top-k distribution) or ``ce`` (to the text) (``training/finetune.py``). The black-box case:
  a 68M Llama per task for Vicuna (MetaSD), T5-small on XSum for T5 (Huang et al.).

Writes into ``out`` (default ``$SPECBENCH_CACHE/drafters/<name>``): the weights (eagle:
``model.safetensors`` + ``config.json`` whose ``specbench`` entry holds the metadata; hf: a
``save_pretrained`` directory + ``specbench.json``), the metadata naming the kind, the target and its
vocabulary fingerprint, the data, the steps (and the sub-vocabulary); ``history.csv``, ``loss.png``,
``metrics.json`` (held-out agreement with the target and expected accepted tokens at draft length 4
on every task of ``eval_sets``; for eagle heads also ``top1_by_depth`` / ``accept_by_depth`` for draft
depths 1-5, on those tasks and on the training split's held-out rows, ``validation``, with their
``definitions``), and ``state.pt`` after every epoch, so an interrupted run resumes to
the same weights as an uninterrupted one.

Any target dtype: the teacher (the target) runs in its own dtype (``target.dtype``, e.g. bfloat16);
the drafter trains in float32 on the teacher's outputs cast to float32 (features, top-k
probabilities; an eagle head scores through a float32 copy of the LM-head rows it uses). The
checkpoint is saved in float32 and its metadata records the teacher's dtype (``dtype``); at decode
time a drafter follows the target's dtype unless its config sets one.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from specbench.drafters.head_files import vocab_fingerprint
from specbench.errors import SpecbenchError, plain_name
from specbench.files import atomic_write_text
from specbench.models.store import cache_dir, make_cache_dir
from specbench.pipelines import tables
from specbench.pipelines.session.prompting import eos_ids_of, load_inputs
from specbench.pipelines.session.run_dir import differences, lock_run_dir, start_run
from specbench.records import HISTORY_CSV, METRICS, SIGNATURE
from specbench.training.fit import LR_SCHEDULES, FitSpec, epochs_done, fit
from specbench.training.recipe import examples_of, learned_tokens, target_dtype_name, training_precision
from specbench.training.responses import response_cache, target_responses
from specbench.training.trainees import TRAINEES, held_out_metrics

log = logging.getLogger(__name__)


def checkpoint_dir(cfg: DictConfig) -> Path:
    if cfg.get("out"):
        return Path(str(cfg.out))
    name = plain_name(
        cfg.get("name") or cfg.dataset.get("name") or "head",
        "name",
        "name the drafter with one plain name (e.g. name=my_head), or write it elsewhere with out=<dir>",
    )
    return cache_dir() / "drafters" / name


STATE = "state.pt"  # the training state beside the checkpoint, written after every epoch (training/fit.py)


# train keys that do not change the weights (how long to run, what to measure afterwards)
UNSIGNED_TRAIN_KEYS = ("epochs", "time_budget_s", "eval_datasets", "generate_batch", "generate_only")
# train keys added after checkpoints were first written, with the value that reproduces the older training:
# a stored signature without one matches a config that leaves it at this value
LATER_TRAIN_KEYS = {
    "unroll": 1,
    "unroll_weights": None,
    "feature_noise": 0.0,
    "precision": "float32",
    "prompt_positions": False,
    "lr_schedule": "constant",
}


def signature(cfg: DictConfig) -> dict:
    """What must match for a rerun to resume a checkpoint directory (the teacher's dtype included;
    ``train.precision: auto`` resolved, so a resume on another machine sees what it would train in)."""
    plain = lambda node: OmegaConf.to_container(node, resolve=True)  # noqa: E731
    train = {k: v for k, v in plain(cfg.train).items() if k not in UNSIGNED_TRAIN_KEYS}
    if (
        str(train.get("lr_schedule") or "constant") != "constant"
    ):  # a decaying rate's horizon is the epoch count
        train["epochs"] = int(cfg.train.epochs)
    if "precision" in train:
        train["precision"] = training_precision(cfg)
    return {
        "target": str(cfg.target.model),
        "dtype": target_dtype_name(cfg),
        "dataset": plain(cfg.dataset),
        "drafter": plain(cfg.drafter),
        "train": train,
    }


def same_signature(stored: dict, sig: dict) -> bool:
    """``stored`` (a checkpoint's signature.json) matches ``sig``; a signature written before the teacher's
    dtype was part of it (no ``dtype`` key) matches on the rest."""
    if "dtype" not in stored:
        sig = {k: v for k, v in sig.items() if k != "dtype"}
    train = dict(sig.get("train") or {})
    for key, default in LATER_TRAIN_KEYS.items():  # older checkpoints: trained as these defaults train
        if key not in (stored.get("train") or {}) and key in train and train[key] == default:
            del train[key]
    return stored == {**sig, "train": train} if "train" in sig else stored == sig


def check_options(cfg: DictConfig) -> None:
    """The names train-drafter reads from the config, checked before anything loads."""
    kind, tr = str(cfg.drafter.kind), cfg.train
    if kind not in TRAINEES:
        raise SpecbenchError(
            f"train-drafter: drafter.kind '{kind}' is not supported", f"use one of: {', '.join(TRAINEES)}"
        )
    schedule = str(tr.get("lr_schedule") or "constant")
    if schedule not in LR_SCHEDULES:
        raise SpecbenchError(
            f"train.lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got '{schedule}'",
            "constant: train.lr throughout; linear: decay from train.lr to 0 over train.epochs",
        )
    if str(tr.responses) not in ("reference", "target"):
        raise SpecbenchError(
            f"train.responses must be reference or target, got '{tr.responses}'",
            "set train.responses=reference (teacher-forced references) or target",
        )


def claim_checkpoint(cfg: DictConfig) -> Path:
    """The checkpoint directory, locked for this process, its ``signature.json`` matching this config (or, with
    ``overwrite=true``, its training state dropped)."""
    ckpt = checkpoint_dir(cfg)
    if not cfg.get("out"):
        make_cache_dir(
            ckpt
        )  # an unwritable cache is named as such (SPECBENCH_CACHE), not as the run directory
    lock_run_dir(
        ckpt,
        "train-drafter",
        fix=f"wait for that run to finish (or stop it), or train into another "
        f"checkpoint directory: out=<dir> or name=<name> (now {ckpt})",
        elsewhere=f"out=<another directory> or name=<name> (now {ckpt})",
    )
    sig = signature(cfg)
    stored = json.loads((ckpt / SIGNATURE).read_text()) if (ckpt / SIGNATURE).exists() else None
    if stored is not None and not same_signature(stored, sig):
        if not cfg.get("overwrite"):
            raise SpecbenchError(
                f"{ckpt} holds a drafter trained with another config ("
                + "; ".join(differences(stored, sig))
                + ")",
                "pass out=<another directory> or name=<another name>, or overwrite=true",
            )
        (ckpt / STATE).unlink(missing_ok=True)
    atomic_write_text(ckpt / SIGNATURE, json.dumps(sig, indent=1))
    return ckpt


def fit_spec(cfg: DictConfig, default_lr: float) -> FitSpec:
    tr = cfg.train
    return FitSpec(
        epochs=int(tr.epochs),
        batch_size=int(tr.batch_size),
        lr=float(tr.lr) if tr.get("lr") is not None else default_lr,
        schedule=str(tr.get("lr_schedule") or "constant"),
        seed=int(tr.seed),
        time_budget_s=float(tr.time_budget_s) if tr.get("time_budget_s") else None,
    )


def check_epochs(ckpt: Path, epochs: int) -> int:
    """The epochs ``ckpt`` holds; refused when more than ``train.epochs`` (its export would be the longer
    training under a shorter recipe)."""
    done = epochs_done(ckpt / STATE)
    if done > epochs:
        raise SpecbenchError(
            f"{ckpt} holds a drafter trained for {done} epochs; train.epochs={epochs} asks for fewer "
            "(its export would be the longer training)",
            f"set train.epochs={done} (or more) to resume it, train into another directory (out=<dir> "
            f"or name=<name>), or delete {ckpt / STATE} to train again from the start",
        )
    return done


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    out = start_run(cfg, output_dir, command="train-drafter")
    check_options(cfg)
    tr = cfg.train
    ckpt = claim_checkpoint(cfg)
    inputs = load_inputs(
        cfg, tr.get("max_input_tokens") or cfg.dataset.get("max_input_tokens")
    )  # as eval does
    target, tok, eos = inputs.target, inputs.loaded.tokenizer, eos_ids_of(inputs.loaded)
    responses = None
    if str(tr.responses) == "target":  # the target's own answers (cached), else the references
        batch = int(tr.get("generate_batch") or 32)
        responses = target_responses(
            target,
            inputs.prompter,
            inputs.queries,
            response_cache(target),
            int(tr.max_new_tokens),
            eos,
            batch,
        )
    if tr.get("generate_only"):
        return answers_only(out, target, responses)
    examples = examples_of(
        inputs.queries, inputs.prompter, tok, responses, int(tr.max_tokens), bool(tr.get("prompt_positions"))
    )
    n_val = min(int(tr.val_examples), len(examples) // 5)
    train_ex, val_ex = examples[n_val:], examples[:n_val]
    if not train_ex:
        raise SpecbenchError(
            "no training sequences (every response was empty or the dataset is too small)",
            "use more rows (dataset.limit) or longer train.max_tokens",
        )
    for p in target.model.parameters():
        p.requires_grad_(False)
    trainee = TRAINEES[str(cfg.drafter.kind)](cfg, target, train_ex, eos)
    spec = fit_spec(cfg, trainee.default_lr)
    from specbench import provenance

    provenance.record(
        ckpt
    )  # the code that trains the head, where the head lives (a resumed part: its own entry)
    train_items = val_items = []
    teacher_started = time.perf_counter()
    # a finished run (rerun for its files) needs no teacher pass
    if check_epochs(ckpt, spec.epochs) < spec.epochs:
        train_items = trainee.items(train_ex, "teacher (train)")
        val_items = trainee.items(val_ex, "teacher (held out)", response_only=True)
    teacher_s = time.perf_counter() - teacher_started
    history = fit(trainee, train_items, val_items, spec, ckpt / STATE, desc=f"train-drafter {ckpt.name}")
    meta = checkpoint_meta(cfg, target, tok, trainee, train_ex, len(history), spec)
    trainee.save(ckpt, meta)
    write_history(history, ckpt, title=f"{ckpt.name}: {cfg.target.model}")
    if val_ex and not val_items:  # a finished run rerun for its files: the held-out rows still get scored
        val_items = trainee.items(val_ex, "teacher (held out)", response_only=True)
    metrics = held_out_metrics(cfg, trainee, target, inputs.prompter, tok, ckpt, eos, val_items)
    save_metrics(metrics, meta, history, teacher_s, ckpt, out)
    atomic_write_text(out / "checkpoint.txt", str(ckpt) + "\n")
    return out


def save_metrics(
    metrics: dict, meta: dict, history: list[dict], teacher_s: float, ckpt: Path, out: Path
) -> None:
    """The held-out metrics with the data's size and the seconds spent, beside the checkpoint and in the run."""
    metrics["data"] = {
        k: meta[k] for k in ("train_sequences", "train_tokens", "train_response_tokens", "prompt_positions")
    }
    metrics["seconds"] = {
        "teacher_pass (this session)": round(teacher_s, 1),
        "training": round(sum(float(r.get("seconds") or 0) for r in history), 1),
    }
    atomic_write_text(ckpt / METRICS, json.dumps(metrics, indent=1))
    write_metrics(metrics, out, ckpt)


def checkpoint_meta(cfg: DictConfig, target, tok, trainee, train_ex, epochs: int, spec) -> dict:
    """What a checkpoint's ``config.json`` says under ``specbench``: the kind, the target and its vocabulary, the data
    and the training recipe."""
    tr = cfg.train
    return {
        "kind": str(cfg.drafter.kind),
        "target": str(cfg.target.model),
        "dtype": str(target.model.dtype).removeprefix("torch."),
        "vocab": vocab_fingerprint(tok),
        **trainee.meta,
        "data": OmegaConf.to_container(cfg.dataset, resolve=True),
        "responses": str(tr.responses),
        "train_sequences": len(train_ex),
        "train_tokens": learned_tokens(train_ex),
        "train_response_tokens": int(sum(len(e.ids) - e.start for e in train_ex)),
        "prompt_positions": bool(tr.get("prompt_positions")),
        "epochs": epochs,
        "lr": spec.lr,
        "lr_schedule": spec.schedule,
        "seed": spec.seed,
    }


def answers_only(out: Path, target, responses: dict | None) -> Path:
    """``train.generate_only``: the target's answers are cached; nothing is trained."""
    n = sum(len(r) for r in (responses or {}).values())
    log.info(
        "train.generate_only: %d answers (%d tokens) in %s; no training",
        len(responses or {}),
        n,
        response_cache(target),
    )
    atomic_write_text(
        out / "responses.txt", f"{response_cache(target)}\n{len(responses or {})} answers, {n} tokens\n"
    )
    return out


def write_history(history: list[dict], ckpt: Path, title: str) -> None:
    """``history.csv`` and ``loss.png`` beside the checkpoint."""
    hist = pd.DataFrame(history)
    tables.write_csv(hist, ckpt / HISTORY_CSV)
    try:
        if len(hist):
            plot_history(hist, ckpt / "loss.png", title=title)
    except ImportError:
        log.warning("matplotlib is not installed: loss.png skipped")


def write_metrics(metrics: dict, out: Path, ckpt: Path) -> None:
    """The held-out metrics as the run's ``metrics`` table, printed."""
    rows = [
        *([("validation", metrics["validation"])] if metrics.get("validation") else []),
        *metrics["tasks"].items(),
    ]
    table = pd.DataFrame(
        [
            {
                "task": t,
                **{k: v for k, v in m.items() if not isinstance(v, list)},
                **{f"accept_d{d + 1}": v for d, v in enumerate(m.get("accept_by_depth") or [])},
            }
            for t, m in rows
        ]
    )
    tables.write_tables(
        table,
        out,
        stem="metrics",
        title=f"train-drafter {ckpt.name}",
        notes="top1: held-out agreement of the drafter's argmax with the target's (teacher-forced); "
        "expected_accepted: accepted draft tokens per round at draft length 4 drafting on "
        "its own (exact for the target's own text, an estimate on reference text).",
    )
    tables.print_table(tables.to_markdown(table), title=f"drafter {ckpt} (held-out)")


def plot_history(hist: pd.DataFrame, path: Path, title: str = "") -> None:
    plt = tables.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for col in ("loss", "val_loss"):
        if col in hist:
            ax.plot(hist.epoch, hist[col], label=col)
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    if "val_top1" in hist:
        ax2 = ax.twinx()
        ax2.plot(hist.epoch, hist.val_top1, color="gray", ls="--", label="held-out top-1")
        ax2.set_ylabel("top-1 agreement")
        ax2.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compare(dirs: list[Path]) -> pd.DataFrame:
    """One row per train-drafter checkpoint directory (its ``metrics.json``): held-out top-1 by depth on its
    own split's held-out rows, expected accepted tokens at draft length 4, data and training seconds."""
    rows = []
    for d in dirs:
        m = json.loads((Path(d) / METRICS).read_text())
        v = m.get("validation") or {}
        rows.append(
            {
                "head": Path(d).name,
                **{f"top1_d{i + 1}": x for i, x in enumerate(v.get("top1_by_depth") or [])},
                "expected_accepted": v.get("expected_accepted"),
                "tokens": (m.get("data") or {}).get("train_tokens"),
                "train_s": (m.get("seconds") or {}).get("training"),
                **{f"{t}_top1": x.get("top1") for t, x in (m.get("tasks") or {}).items()},
            }
        )
    return pd.DataFrame(rows)


if __name__ == "__main__":  # python -m specbench.pipelines.train_drafter DIR... : compare checkpoints
    import sys

    from specbench.errors import exit_on
    from specbench.files import existing

    try:
        existing(sys.argv[1:], "the trained head", "pass checkpoint directories of train-drafter (out=<dir>)")
    except SpecbenchError as exc:
        exit_on(exc)
    table = compare([Path(a) for a in sys.argv[1:]])
    print(tables.to_markdown(table.round(3)))
