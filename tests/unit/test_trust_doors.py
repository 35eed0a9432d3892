"""Issue 45 (trust, round 4), one test per mechanism, no model loaded: every write of tensors goes through one door
that gives the file a plain mode; a directory taken by a run is swept of the temporary files a killed write left;
names that become paths stay under their root; loaded files are checked by shape."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from specbench.errors import SpecbenchError, inside, plain_name
from specbench.files import atomic_path, current_umask, plain_modes, save_tensors


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_tensors_and_library_writes_get_plain_modes(tmp_path):
    """safetensors' own writer leaves 0600; the door gives the mode a plain write under the umask gives."""
    want = 0o666 & ~current_umask()
    save_tensors({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
    assert mode(tmp_path / "model.safetensors") == want
    lib = tmp_path / "pretrained"
    (lib / "sub").mkdir(parents=True)
    (lib / "sub" / "weights.bin").write_bytes(b"x")
    os.chmod(lib / "sub" / "weights.bin", 0o600)
    os.chmod(lib / "sub", 0o700)
    plain_modes(lib)
    assert mode(lib / "sub" / "weights.bin") == want and mode(lib / "sub") == 0o777 & ~current_umask()


def test_a_taken_directory_is_swept_of_a_killed_writes_temporaries(tmp_path):
    from specbench.pipelines.session.run_dir import lock_run_dir

    d = tmp_path / "ckpt"
    d.mkdir()
    # a write interrupted after creating its temporary
    with pytest.raises(KeyboardInterrupt), atomic_path(d / "state.pt") as tmp:
        tmp.write_bytes(b"half")
        raise KeyboardInterrupt
    left = d / ".state.pt.abc123.tmp"  # what a SIGKILL (no cleanup at all) leaves
    left.write_bytes(b"half")
    (d / "notes.tmp").write_text("a user's file, not ours")
    lock_run_dir(d, None)
    assert not left.exists() and (d / "notes.tmp").exists()
    assert not list(d.glob(".state.pt.*"))


@pytest.mark.parametrize("bad", ["../../escape_head", "a/b", ".hidden", "", "..", "a\\b"])
def test_names_that_become_paths_are_one_plain_name(bad):
    with pytest.raises(SpecbenchError, match="one plain name"):
        plain_name(bad, "name", "fix")
    assert plain_name("eagle_math", "name", "fix") == "eagle_math"


def test_cache_paths_stay_inside_the_cache(tmp_path):
    from specbench.models.loading import resolve_cached

    assert inside(tmp_path, "drafters/h", "the cache: path", "fix") == tmp_path / "drafters" / "h"
    for bad in ("../outside", "drafters/../../x", "/etc"):
        with pytest.raises(SpecbenchError, match="must be a path inside"):
            inside(tmp_path, bad, "the cache: path", "fix")
    with pytest.raises(SpecbenchError, match="must be a path inside"):
        resolve_cached("cache:../../elsewhere")


def test_train_drafter_refuses_a_name_that_leaves_the_cache():
    from omegaconf import OmegaConf

    from specbench.pipelines.train_drafter import checkpoint_dir

    with pytest.raises(SpecbenchError, match="name='../../escape_head' must be one plain name"):
        checkpoint_dir(OmegaConf.create({"name": "../../escape_head", "dataset": {"name": "d"}}))


@pytest.mark.parametrize(
    "content", ["{}", "[]", "[1, 2]", '[{"claim": "c"}]', '{"claim": "c", "held": true}']
)
def test_replayed_verdicts_are_checked_by_shape(tmp_path, content):
    from specbench.reproduction.long_horizon import VERDICTS_DATA, load_verdicts

    (tmp_path / VERDICTS_DATA).write_text(content)
    with pytest.raises(SpecbenchError, match="is not a list of verdicts"):
        load_verdicts(tmp_path)
    (tmp_path / VERDICTS_DATA).write_text(json.dumps([{"claim": "c", "held": True, "detail": ""}]))
    assert load_verdicts(tmp_path)[0].held is True


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_names_the_records_file():
    """Issue 45 case 4: write() errors carry no file name, so a full disk's error named none."""
    import errno

    from specbench.cli import os_failure
    from specbench.records import JsonlWriter

    writer = JsonlWriter(Path("/dev/full"))  # every write: ENOSPC
    with pytest.raises(OSError) as err:
        writer.write({"query_id": "q"})
    assert err.value.errno == errno.ENOSPC and err.value.filename == "/dev/full"
    assert "no space left on the device writing /dev/full" in os_failure(err.value, "elsewhere").problem
    with pytest.raises(OSError):
        writer.close()  # the unflushed line fails again, named too


def test_fix_lines_never_offer_what_is_already_set_or_cannot_work(tmp_path):
    """Issue 45 case 9: a null field was reported as missing (listing it among the fields it has); a prompt too long
    under decoding.fit_context=true offered decoding.fit_context=true; --readme was checked after --publish wrote."""
    from specbench.pipelines.session.prompting import Context
    from specbench.reproduction.readme import check_readme
    from specbench.tasks.formats import need

    with pytest.raises(SpecbenchError, match="field 'question' is null") as err:
        need({"question": None, "answer": "4"}, "question", "g.jsonl:1")
    assert "give 'question' a value" in err.value.fix
    ctx = Context(100, "max_position_embeddings", "m")
    with pytest.raises(SpecbenchError) as err:
        ctx.check("q", 200, 8)
    assert "decoding.fit_context=true" in err.value.fix
    with pytest.raises(SpecbenchError) as err:
        ctx.check("q", 200, 8, fitting=True)
    assert "fit_context" not in err.value.fix and "max_input_tokens" in err.value.fix
    with pytest.raises(SpecbenchError) as err:
        ctx.check("q", 200, 8, encoder_decoder=True)
    assert "fit_context" not in err.value.fix  # it never shortens an encoder-decoder generation
    with pytest.raises(SpecbenchError, match="no such file"):
        check_readme(tmp_path / "missing" / "README.md")
    (tmp_path / "README.md").write_text("# no markers\n")
    with pytest.raises(SpecbenchError, match="has no generated-report block"):
        check_readme(tmp_path / "README.md")


def test_nits_name_the_right_setting_and_a_fix_that_works(tmp_path, tiny_llama_target):
    """Issue 45 case 10: replay traces=<an eval run> offered "trace into it first", which the eval directory then
    refuses; the small drafter's layer count was reported as an early-exit setting."""
    from specbench.drafters.small import SmallLM
    from specbench.pipelines.session.run_dir import lock_run_dir
    from specbench.pipelines.trace import load_traces

    d = tmp_path / "ev"
    lock_run_dir(d, "eval")
    with pytest.raises(SpecbenchError, match="is a `specbench eval` run directory, not a trace") as err:
        load_traces(d)
    assert "trace into a new directory" in err.value.fix
    with pytest.raises(
        SpecbenchError, match=r"the small drafter's layers \(drafter.layers\)=100 is out of range"
    ):
        SmallLM(tiny_llama_target, 100, None)


def test_a_policy_is_recognised_by_its_class_not_its_name():
    """Issue 44: a policy was recognised by ``_target_.endswith("PolicySelector")``; now by the class's own flag."""
    from specbench.selection.base import context_aware

    assert context_aware("specbench.selection.PolicySelector")
    assert context_aware("specbench.selection.policy.PolicySelector")
    assert not context_aware("specbench.selection.UCB")
    assert not context_aware("specbench.selection.NoSuchSelector") and not context_aware(None)
    assert not context_aware("builtins.dict")  # a class, not a selector
