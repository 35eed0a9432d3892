"""User-facing errors: each names the problem and the fix."""


class SpecbenchError(Exception):
    """An error caused by input the user controls (config, files, installed packages).

    The CLI prints these without a traceback: ``problem`` says what is wrong, ``fix`` what to do.
    """

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}\n  fix: {fix}")
