"""The Engine protocol (engines/base.py): every registered engine is an `Engine`, declares its
capabilities as attributes, and is built and checked through the protocol, never by probing."""
from __future__ import annotations

import ast
import copy
from pathlib import Path

import torch
from conftest import MICRO

from agentrl_cli import config
from agentrl_cli.engines import ENGINES, Engine, HFEngine, KVBatch, build_engine, check_engine
from agentrl_cli.engines.base import ForkableBatch

ROOT = Path(__file__).resolve().parents[1] / "agentrl_cli"


def test_every_engine_declares_its_capabilities():
    for name in ENGINES.names():
        cls = ENGINES.get(name)             # vllm: its module only, not the vllm package
        assert issubclass(cls, Engine) and cls.name == name
        assert isinstance(cls.token_level, bool)
    assert HFEngine.token_level is True and ENGINES.get("vllm").token_level is False
    check_engine("hf")                      # nothing to check: the base's no-op


def test_hf_engine_from_config_and_its_batch(micro_policy):
    model, _, fmt, _ = micro_policy
    engine = build_engine(config.load(sets=MICRO), model, fmt)
    assert type(engine) is HFEngine and engine.model is model
    batch = engine.new_batch(2)
    assert isinstance(batch, KVBatch)
    for op in ("extend", "generate", "add_row", "fork", "truncate", "keep", "pack"):
        assert callable(getattr(batch, op)) and hasattr(ForkableBatch, op)


def test_hf_engine_load_weights(micro_policy):
    """In the trainer's process the engine shares the model (nothing to load); a worker's copy
    takes the new weights."""
    model = micro_policy[0]
    engine = HFEngine(copy.deepcopy(model), 0)
    engine.load_weights(engine.model)       # its own model: a no-op
    new = {k: v + 1.0 for k, v in model.state_dict().items()}
    engine.load_weights(new)
    got = engine.model.state_dict()
    assert all(torch.equal(got[k], new[k]) for k in new)
    engine.release()                        # the base's no-op


def test_no_engine_is_probed_with_hasattr():
    """Capabilities are attributes of the protocol: engines/ never asks `hasattr` of an engine."""
    for f in (ROOT / "engines").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "hasattr":
                probed = ast.unparse(node.args[0])
                assert "cls" not in probed and "engine" not in probed.lower(), (f.name, probed)
