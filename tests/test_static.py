"""Static check of the package, the tests, the benchmarks and the experiment scripts: no name is used that is never
defined (pyflakes), the kind of error that only fails when a rarely run branch executes (a
critic import in the wrong function once broke `agentrl rollout --checkpoint` for FOCUS)."""
from __future__ import annotations

from pathlib import Path

from pyflakes import api, messages, reporter

ROOT = Path(__file__).resolve().parents[1]
FATAL = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport,
         messages.DuplicateArgument, messages.ReturnOutsideFunction)


class _Collect(reporter.Reporter):
    def __init__(self):
        super().__init__(None, None)
        self.found: list[str] = []

    def flake(self, message):
        if isinstance(message, FATAL):
            self.found.append(str(message))

    def syntaxError(self, filename, msg, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: {msg}")

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")


def test_no_undefined_names():
    rep = _Collect()
    files = [p for d in ("agentrl_cli", "tests", "benchmarks", "experiments") for p in (ROOT / d).rglob("*.py")]
    assert len(files) > 50
    for path in files:
        api.checkPath(str(path), rep)
    assert rep.found == []


def test_the_check_catches_an_undefined_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from os import path\n\n\ndef g():\n    return path.join('a')\n")
    rep = _Collect()
    api.checkPath(str(bad), rep)
    assert len(rep.found) == 1 and "undefined name 'path'" in rep.found[0]
