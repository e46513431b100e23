"""The documentation a user reads: a short README, links that resolve inside the repository,
generated pages that are current, and no process notes anywhere."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from agentrl_cli.reporting import docs

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DESIGN = "DESIGN" + ".md"   # a file the repository lacks; built, so this file does not cite it


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "docs" / "log").glob("*.md"))]


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
        assert "../shared" not in text and "METHODS.md" not in text and DESIGN not in text, page


def test_nothing_cites_a_design_document_the_repository_lacks():
    """The design document is docs/architecture.md: no file of the package, the tests, the
    docs or the README cites `DESIGN` (the file name above), which the repository lacks."""
    assert not (ROOT / DESIGN).exists()
    files = [ROOT / "README.md", *(p for d in ("agentrl_cli", "tests", "docs")
                                   for p in sorted((ROOT / d).rglob("*"))
                                   if p.is_file() and "__pycache__" not in p.parts)]
    citing = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:            # a binary file (a figure, weights)
            continue
        if DESIGN in text:
            citing.append(str(f.relative_to(ROOT)))
    assert not citing, f"cite docs/architecture.md instead of {DESIGN}: {citing}"


def test_generated_pages_are_current():
    """`python -m agentrl_cli.reporting.docs` rewrites these; run it after changing a recipe
    or a config field's docstring."""
    config = (ROOT / "docs" / "config.md").read_text()
    assert config == docs.config_page(docs.config_details(config))
    assert (ROOT / "docs" / "methods_table.md").read_text() == docs.methods_page()
    readme = (ROOT / "README.md").read_text()
    assert docs.readme_with_table(readme) == readme


def test_config_reference_lists_every_key_with_its_docstring():
    from agentrl_cli.config import describe

    page = docs.config_page()
    for key, default, help_ in describe():
        assert f"| `{key}` | `{default}` |" in page and help_, key


FIELD_DOC_CHARS = 200          # a field doc is a sentence or two; the rest goes to the details


def split_doc_problems(rows: list[tuple[str, str]], page: str) -> list[str]:
    """What breaks the split between a config field's short doc (`rows`: key, doc) and its
    explanation in the config page's details: a doc over FIELD_DOC_CHARS, a doc pointing at
    details its key lacks, a details section no doc points at or no longer than the doc."""
    found = dict(re.findall(r"^### `([^`]+)`\n\n(.+?)(?=\n### |\Z)", docs.config_details(page),
                            re.S | re.M))
    pointed = {k for k, doc in rows if doc.endswith(docs.POINTER)}
    problems = [f"{k}: {len(doc)} characters" for k, doc in rows if len(doc) > FIELD_DOC_CHARS]
    problems += [f"{k}: no details" for k in sorted(pointed - found.keys())]
    problems += [f"{k}: details without a pointer" for k in sorted(found.keys() - pointed)]
    docs_of = dict(rows)
    problems += [f"{k}: details no longer than the doc" for k in sorted(found.keys() & pointed)
                 if len(found[k].strip()) <= len(docs_of[k])]
    return problems


def _field_docs() -> list[tuple[str, str]]:
    from agentrl_cli.config import describe
    from agentrl_cli.config.schema import CAPS

    return [(k, h.removesuffix(f" At most {CAPS[k]:,}.") if k in CAPS else h)
            for k, _, h in describe()]


def test_config_field_docs_are_short_and_their_details_are_in_the_reference():
    page = (ROOT / "docs" / "config.md").read_text()
    assert not split_doc_problems(_field_docs(), page)
    assert sum(doc.endswith(docs.POINTER) for _, doc in _field_docs()) >= 30


def test_the_split_check_finds_a_long_doc_and_a_lost_explanation():
    page = (ROOT / "docs" / "config.md").read_text()
    rows = _field_docs()
    key, doc = next((k, d) for k, d in rows if d.endswith(docs.POINTER))
    long = [(k, d.replace(docs.POINTER, "More. " * 40 + docs.POINTER) if k == key else d)
            for k, d in rows]
    assert f"{key}: {len(doc) + 240} characters" in split_doc_problems(long, page)
    lost = re.sub(rf"### `{re.escape(key)}`\n\n.+?\n(?=### )", "", page, flags=re.S)
    assert split_doc_problems(rows, lost) == [f"{key}: no details"]
    unpointed = [(k, d.removesuffix(" " + docs.POINTER) if k == key else d) for k, d in rows]
    assert split_doc_problems(unpointed, page) == [f"{key}: details without a pointer"]


def test_results_name_their_commands():
    text = (ROOT / "docs" / "results.md").read_text()
    sections = re.split(r"\n## ", text)[1:]
    for s in sections:
        if "|---" in s:   # a section with a table says how to reproduce it
            # in prose, or as a fenced bash block (a generated table's commands)
            assert re.search(r"[Cc]ommand|`agentrl |`python |`bash\b", s), s.splitlines()[0]


# Words about the work on the product rather than the product itself (the planted examples
# below show each kind). Anywhere, code included: numbered work sessions. In prose (every line
# of Markdown, YAML and other text files; comments and docstrings of Python and shell files,
# whose code may use a scratch folder by design): issue and pull-request numbers, the machine or
# session the text was written in (name the machine instead: a 2-core CPU, the GPU machine), a
# goal of the work spoken of as a target (the product names its thresholds: `target_success`),
# and scratch paths under the system's temp folder (examples write under runs/).
ANYWHERE = re.compile(r"sessions? [0-9]|session-[0-9]", re.I)
PROSE = re.compile(
    r"(?<![\w&/#])#[0-9]{1,5}\b(?![\w-])"            # a hash and a number, not a colour or anchor
    r"|\b(?:issue|pull request|PR|ticket)s? #?[0-9]+"
    r"|\bthis (?:machine|session)\b"
    r"|\bthe target\b"
    r"|(?<![\w.~$])/tmp/",                             # not part of a longer path
    re.I)


def _prose_lines(text: str, suffix: str) -> dict[int, str]:
    """Line number -> the prose on it: every line of a page; comments and docstrings (bare
    string statements) of a Python or shell file."""
    if suffix == ".py":
        import io
        import tokenize

        out: dict[int, str] = {}
        prev = tokenize.NEWLINE
        try:
            toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
        except (tokenize.TokenError, SyntaxError):
            return dict(enumerate(text.splitlines(), 1))
        for i, t in enumerate(toks):
            nxt = toks[i + 1].type if i + 1 < len(toks) else tokenize.ENDMARKER
            docstring = (t.type == tokenize.STRING and nxt in (tokenize.NEWLINE, tokenize.ENDMARKER)
                         and prev in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT,
                                      tokenize.DEDENT, tokenize.ENCODING))
            if t.type == tokenize.COMMENT or docstring:
                for n, line in enumerate(t.string.splitlines(), t.start[0]):
                    out[n] = out.get(n, "") + " " + line
            if t.type not in (tokenize.COMMENT, tokenize.NL):
                prev = t.type
        return out
    if suffix in (".sh", ".bash"):
        return {n: m.group(1) for n, line in enumerate(text.splitlines(), 1)
                if (m := re.search(r"(?:^|\s)(#.*)", line))}
    return dict(enumerate(text.splitlines(), 1))


def process_notes(text: str, suffix: str = ".md") -> list[int]:
    """The line numbers of `text` (a file's contents; `suffix` its kind) with process notes."""
    hits = {n for n, line in enumerate(text.splitlines(), 1) if ANYWHERE.search(line)}
    hits |= {n for n, prose in _prose_lines(text, suffix).items() if PROSE.search(prose)}
    return sorted(hits)


def test_the_process_note_checker_on_planted_examples():
    for bad in ("fixed in #17.", "see issue 30", "as PR 12 did", "(pull request #4)",
                "measured on this machine", "in this session we", "session" + " 3",
                "session" + "-12",
                "The target of +10 points is not met", "agentrl train --out /tmp/x",
                "AGENTRL_CACHE=/tmp/c python x.py", "logs go to ${OUT:-/tmp/check}"):
        assert process_notes(f"ok\n{bad}\n") == [2], bad
    for good in ("color #1f77b4 and #ffffff", "[link](page.md#agentrl-ablate)", "# 3 steps",
                 "560 issues over a few repositories", "--out runs/g0", "a short folder in `/tmp`",
                 "the warm-up stops at `target_success`", "the critic's target is exact",
                 "$TMPDIR/tmp/x", "on a 2-core machine", "a/tmp/b"):
        assert process_notes(f"{good}\n") == [], good
    code = ('"""Run with OUT=/tmp/x."""\nOUT = "/tmp/x"  # default: a scratch folder\n'
            'x = 1  # fixed in #17\nlog("/tmp/y")\n')
    assert process_notes(code, ".py") == [1, 3]
    assert process_notes('OUT=${OUT:-/tmp/x}\n# OUT=/tmp/y bash check.sh\n', ".sh") == [2]


def test_no_process_notes_in_the_repository():
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                 if p.is_file() and not {".git", ".venv"} & set(p.parts)]
    hits = []
    for f in files:
        p = ROOT / f
        try:
            text = p.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        hits += [f"{f}:{n}" for n in process_notes(text, p.suffix)]
    assert not hits, hits


def _readme_install_block() -> list[str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_block", ROOT / ".ci" / "readme_block.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.install_block((ROOT / "README.md").read_text())


def test_ci_runs_the_readmes_install_and_test_lines():
    """CI installs and tests with the README's own lines: `.ci/run` runs the README's install
    block (which ends with the test command the README shows) and installs nothing itself."""
    block = [line.split("#")[0].strip() for line in _readme_install_block()]
    assert block[-1] == "python -m pytest -q"
    readme = (ROOT / "README.md").read_text()
    two = readme.split("## The two commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert block[-1] in [line.split("#")[0].strip() for line in two.splitlines()]
    assert any("bfcl-eval" in line for line in block), "the BFCL tests need bfcl-eval"
    assert any("chromium-driver" in line for line in block), "the browser test needs Chromium"
    assert any('pip install -e ".[test]"' in line for line in block)
    ci = (ROOT / ".ci" / "run").read_text()
    code = [line for line in ci.splitlines() if not line.lstrip().startswith("#")]
    assert any("readme_block.py README.md" in line for line in code)
    assert not any(w in line for line in code for w in ("pip install", "apt-get", "pytest"))
