"""benchmarks.yaml: each benchmark's env adapter, data source, splits, metrics and the papers'
reference numbers.

`get_benchmark(name)` resolves an entry; `Benchmark.presets()` is what `--benchmark NAME` applies
(its env and config overrides); `Benchmark.check()` raises a one-line `ConfigError` that says
how to get missing data (the CLI exits 2). Importing this module registers one env per entry
whose adapter is `qa` (questions read from data files, see envs/qa.py) or `none` (no adapter
for the real data in this version: the name exists so that configs naming it load, and
building it raises the one-line error). Data is read only when an env is built: JSONL files
directly, a saved Hugging Face dataset or parquet files through `datasets` (imported then).

The file is `benchmarks.yaml` at the repository root, or `$AGENTRL_BENCHMARKS`; data folders
are under `$AGENTRL_DATA` (default `./data`).
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..config import YAML_BYTES_CAP, check_yaml
from ..errors import ConfigError
from ..registry import suggest
from .base import ENVS, Task, env_factory
from .qa import QASpec, VERIFIERS, extract_boxed

__all__ = ["Benchmark", "benchmarks_file", "data_root", "get_benchmark", "load_benchmarks",
           "load_qa_tasks", "real_benchmark_envs"]

ADAPTERS = ("builtin", "bfcl", "qa", "none")
SOURCES = ("builtin", "package", "local")
_REQUIRED = ("title", "env", "adapter", "cpu_env", "data", "splits", "metrics")


def benchmarks_file() -> Path:
    env = os.environ.get("AGENTRL_BENCHMARKS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "benchmarks.yaml"


def data_root() -> Path:
    return Path(os.environ.get("AGENTRL_DATA", "data"))


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    env: str                      # env name that runs it
    adapter: str                  # builtin | bfcl | qa | none
    cpu_env: str                  # built-in env standing in for it on a CPU
    data: dict                    # source, path | module, hub, get, fields, answer_from, filter
    splits: dict                  # our split -> {"split": data split name, "size": n (optional)}
    metrics: tuple[str, ...]
    papers: tuple[str, ...] = ()
    verifier: str | None = None   # qa adapter: math | number | exact
    config: dict = field(default_factory=dict)       # dotted overrides --benchmark applies
    reference: tuple[dict, ...] = ()                 # {paper, model, metric, values, note}

    @property
    def data_path(self) -> Path | None:
        p = self.data.get("path")
        return data_root() / p if self.data.get("source") == "local" and p else None

    def data_status(self) -> str:
        """built-in | ready | missing."""
        src = self.data.get("source")
        if src == "builtin":
            return "built-in"
        if src == "package":
            return "ready" if importlib.util.find_spec(self.data["module"]) else "missing"
        return "ready" if self.data_path is not None and self.data_path.exists() else "missing"

    def check(self) -> None:
        """Raise a one-line ConfigError unless the real benchmark can run here: its data is
        present (else: how to get it) and this version has an adapter for it."""
        if self.data_status() == "missing":
            where = (f"package '{self.data['module']}' not installed" if self.data["source"] == "package"
                     else f"no data at {self.data_path}")
            raise ConfigError(f"benchmark '{self.name}': {where}; {self.data['get']}")
        if self.adapter == "none":
            raise ConfigError(f"benchmark '{self.name}': this version has no adapter for the real "
                              f"data; its CPU stand-in is --env {self.cpu_env}")

    def presets(self) -> dict[str, Any]:
        """Config overrides of `--benchmark NAME`: its env and its `config` entries."""
        return {"env.name": self.env, **self.config}

    def reference_rows(self) -> list[tuple[str, str, str, str, str]]:
        """(paper, model, metric, method, value) for every reported number; notes as rows with
        method "note"."""
        rows = []
        for r in self.reference:
            for method, value in (r.get("values") or {}).items():
                rows.append((r["paper"], str(r.get("model") or ""), r["metric"], method, str(value)))
            if r.get("note"):
                rows.append((r["paper"], str(r.get("model") or ""), r["metric"], "note", r["note"]))
        return rows


def _parse(name: str, raw: Any, where: Path) -> Benchmark:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: benchmark '{name}' must be a mapping")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ConfigError(f"{where}: benchmark '{name}' lacks {', '.join(missing)}")
    known = set(_REQUIRED) | {"papers", "verifier", "config", "reference"}
    extra = sorted(set(raw) - known)
    if extra:
        raise ConfigError(f"{where}: benchmark '{name}' has unknown keys {', '.join(extra)}")
    if raw["adapter"] not in ADAPTERS:
        raise ConfigError(f"{where}: benchmark '{name}': adapter must be one of {', '.join(ADAPTERS)}")
    data = dict(raw["data"] or {})
    if data.get("source") not in SOURCES:
        raise ConfigError(f"{where}: benchmark '{name}': data.source must be one of {', '.join(SOURCES)}")
    if data["source"] == "package" and not data.get("module"):
        raise ConfigError(f"{where}: benchmark '{name}': a package source needs data.module")
    if data["source"] == "local" and not data.get("path"):
        raise ConfigError(f"{where}: benchmark '{name}': a local source needs data.path")
    if not data.get("get"):
        raise ConfigError(f"{where}: benchmark '{name}' needs data.get (how to get the data)")
    if raw["adapter"] == "qa":
        if raw.get("verifier") not in VERIFIERS:
            raise ConfigError(f"{where}: benchmark '{name}': a qa adapter needs verifier "
                              f"{' | '.join(VERIFIERS)}")
        if data["source"] != "local" or not (data.get("fields") or {}).get("question"):
            raise ConfigError(f"{where}: benchmark '{name}': a qa adapter needs local data with "
                              "data.fields.question and data.fields.answer")
    splits = {k: (v if isinstance(v, dict) else {"split": v}) for k, v in (raw["splits"] or {}).items()}
    return Benchmark(name=name, title=raw["title"], env=raw["env"], adapter=raw["adapter"],
                     cpu_env=raw["cpu_env"], data=data, splits=splits,
                     metrics=tuple(raw["metrics"]), papers=tuple(raw.get("papers") or ()),
                     verifier=raw.get("verifier"), config=dict(raw.get("config") or {}),
                     reference=tuple(raw.get("reference") or ()))


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict[str, Benchmark]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"benchmarks file not found: {p}")

    if p.stat().st_size > YAML_BYTES_CAP:
        raise ConfigError(f"benchmarks file {p} has more than {YAML_BYTES_CAP:,} bytes")
    text = p.read_text()
    check_yaml(text, str(p))              # bounded before it is built (nested aliases)
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"malformed YAML in {p}: {getattr(e, 'problem', e)}") from None
    entries = doc.get("benchmarks") if isinstance(doc, dict) else None
    if not isinstance(entries, dict):
        raise ConfigError(f"{p} must hold a 'benchmarks' mapping")
    return {name: _parse(name, raw, p) for name, raw in entries.items()}


def load_benchmarks(path: str | Path | None = None) -> dict[str, Benchmark]:
    return _load(str(path or benchmarks_file()))


def get_benchmark(name: str) -> Benchmark:
    """The entry called `name`; an unknown name is a one-line ConfigError listing the valid ones."""
    table = load_benchmarks()
    if name in table:
        return table[name]

    close = suggest(name, list(table))
    hint = f" (did you mean '{close}'?)" if close else ""
    raise ConfigError(f"unknown benchmark '{name}'{hint}; valid: {', '.join(table)}")


def real_benchmark_envs() -> set[str]:
    """Env names of real benchmarks (every adapter but `builtin`); empty without the file."""
    try:
        return {b.env for b in load_benchmarks().values() if b.adapter != "builtin"}
    except ConfigError:
        return set()


# ----------------------------------------------------------------------------- data loading
def _rows(folder: Path, split: str) -> list[dict]:
    for ext in (".jsonl", ".json"):
        f = folder / f"{split}{ext}"
        if f.is_file():
            text = f.read_text()
            if ext == ".json" and text.lstrip().startswith("["):
                return list(json.loads(text))
            return [json.loads(line) for line in text.splitlines() if line.strip()]
    try:
        # deferred: optional extra (datasets)
        import datasets
    except ImportError:
        raise ConfigError(f"no {split}.jsonl in {folder}, and reading other formats needs the "
                          "`datasets` package: pip install -e '.[data]'") from None
    parquet = sorted(folder.glob(f"{split}*.parquet")) or sorted(folder.glob(f"{split}/*.parquet"))
    if parquet:
        return list(datasets.load_dataset("parquet", data_files=[str(f) for f in parquet],
                                          split="train"))
    try:
        saved = datasets.load_from_disk(str(folder))
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"cannot read split '{split}' from {folder}: {e}") from None
    if split not in saved:
        raise ConfigError(f"{folder} has no split '{split}'; it has {', '.join(saved)}")
    return list(saved[split])


def load_qa_tasks(b: Benchmark, split: str) -> list[Task]:
    """Tasks of our split `split` ("train" | "eval" | ...) of a qa benchmark, in file order,
    after `data.filter`; the answer is `data.fields.answer` (its last `\\boxed{}` when
    `data.answer_from` is "boxed")."""
    if split not in b.splits:
        raise ConfigError(f"benchmark '{b.name}' has no {split} split; it has {', '.join(b.splits)}")
    b.check()
    data_split = b.splits[split]["split"]
    q_field, a_field = b.data["fields"]["question"], b.data["fields"]["answer"]
    keep = {k: set(map(str, v)) for k, v in (b.data.get("filter") or {}).items()}
    tasks = []
    for i, row in enumerate(_rows(b.data_path, data_split)):
        if any(str(row.get(k)) not in allowed for k, allowed in keep.items()):
            continue
        if q_field not in row or a_field not in row:
            raise ConfigError(f"{b.data_path}/{data_split}: row {i} lacks '{q_field}' or '{a_field}'")
        answer = str(row[a_field])
        if b.data.get("answer_from") == "boxed":
            answer = extract_boxed(answer)
            if answer is None:
                continue   # no checkable final answer in the solution
        tasks.append(Task(task_id=f"{b.name}-{split}-{i:05d}", prompt=str(row[q_field]),
                          answer=answer, meta={"row": i}))
    return tasks


def _factory(b: Benchmark):
    """Registry factory of a qa or none benchmark env (data is read when it is called)."""

    @env_factory(b.env, ("max_turns",))
    def make(seed: int = 0, max_turns: int = 8):
        b.check()
        tasks = {split: load_qa_tasks(b, split) for split in b.splits}
        return QASpec(b.name, tasks, b.verifier, max_turns)

    make.__doc__ = f"{b.title}: the qa adapter over {b.data.get('path')} (options: max_turns)."
    return make


def _register_all() -> None:
    try:
        table = load_benchmarks()
    except ConfigError:
        return   # no or broken benchmarks.yaml: `agentrl benchmarks` reports it
    for b in table.values():
        if b.adapter in ("qa", "none") and b.env not in ENVS:
            ENVS.register_lazy(b.env, functools.partial(_factory, b))


_register_all()
