"""User-facing errors: each names the problem and the fix."""


class SpecbenchError(Exception):
    """An error caused by input the user controls (config, files, installed packages).

    The CLI prints these without a traceback: ``problem`` says what is wrong, ``fix`` what to do.
    """

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}\n  fix: {fix}")


def plain_name(value, key: str, fix: str) -> str:
    """``value`` as one plain file or directory name (no separator, no ``..``, not hidden, not empty), for a config
    value that names an entry under a managed root (the drafter cache, a run's records): else a ``SpecbenchError``
    naming ``key``, so that no value writes or reads outside that root."""
    name = str(value)
    if not name or name.startswith(".") or any(c in name for c in ("/", "\\", "\0")):
        raise SpecbenchError(
            f"{key}={value!r} must be one plain name (no '/', no '..', not starting with '.'): it names "
            "a directory under a managed root, and this one would leave it or hide",
            fix,
        )
    return name


def inside(root, relative: str, key: str, fix: str):
    """``root / relative`` for a config value naming a path under ``root`` (sub-directories allowed), refused with a
    ``SpecbenchError`` naming ``key`` when a ``..`` or an absolute path would take it outside ``root``."""
    from pathlib import PurePosixPath

    parts = PurePosixPath(str(relative)).parts
    if not parts or str(relative).startswith("/") or ".." in parts:
        raise SpecbenchError(f"{key} {relative!r} must be a path inside {root} (no '..', not absolute)", fix)
    return root / str(relative)


def exit_on(exc: SpecbenchError) -> None:
    """A script's (``python -m specbench...``) bad input: ``error:``/``fix:`` lines on stderr and exit code 2, as the
    command line gives them."""
    import sys

    print(f"error: {exc.problem}" + (f"\nfix:   {exc.fix}" if exc.fix else ""), file=sys.stderr)
    raise SystemExit(2)
