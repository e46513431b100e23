"""The documentation a user reads: a short README, links that resolve inside the repository,
generated pages that are current, and no process notes anywhere."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from agentrl_cli.reporting import docs

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


def test_readme_is_short():
    assert (ROOT / "README.md").stat().st_size < 25_000


def test_every_link_resolves_inside_the_repository():
    bad = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                bad.append(f"{page.name}: {target} (outside the repository)")
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if ROOT not in dest.parents and dest != ROOT:
                bad.append(f"{page.name}: {target} (outside the repository)")
            elif not dest.exists():
                bad.append(f"{page.name}: {target} (missing)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{page.name}: {target} (no such heading)")
    assert not bad, bad
    for page in _pages():
        text = page.read_text()
        assert "../shared" not in text and "METHODS.md" not in text and "DESIGN.md" not in text, page


def test_generated_pages_are_current():
    """`python -m agentrl_cli.reporting.docs` rewrites these; run it after changing a recipe
    or a config field's docstring."""
    assert (ROOT / "docs" / "config.md").read_text() == docs.config_page()
    assert (ROOT / "docs" / "methods_table.md").read_text() == docs.methods_page()
    readme = (ROOT / "README.md").read_text()
    assert docs.readme_with_table(readme) == readme


def test_config_reference_lists_every_key_with_its_docstring():
    from agentrl_cli.config import describe

    page = docs.config_page()
    for key, default, help_ in describe():
        assert f"| `{key}` | `{default}` |" in page and help_, key


def test_results_name_their_commands():
    text = (ROOT / "docs" / "results.md").read_text()
    sections = re.split(r"\n## ", text)[1:]
    for s in sections:
        if "|---" in s:   # a section with a table says how to reproduce it
            assert re.search(r"[Cc]ommand|`agentrl |`python |`bash ", s), s.splitlines()[0]


def test_no_process_notes_in_the_repository():
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                 if p.is_file() and not {".git", ".venv"} & set(p.parts)]
    pat = re.compile(r"sessions? [0-9]|session-[0-9]", re.I)
    hits = []
    for f in files:
        p = ROOT / f
        try:
            text = p.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        hits += [f"{f}:{i}" for i, line in enumerate(text.splitlines(), 1) if pat.search(line)]
    assert not hits, hits
