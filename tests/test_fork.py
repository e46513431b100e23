"""KVBatch forking: a forked row decodes exactly like a from-scratch run on the same prefix."""
from __future__ import annotations

import math

import torch

import pytest

from agentrl_cli.engines.kv_batch import KVBatch
from agentrl_cli.engines.kv_ragged import RaggedKVBatch
from agentrl_cli.engines.sampling import sample_rows
from agentrl_cli.engines.base import SamplingParams

LAYOUTS = pytest.mark.parametrize("layout", [KVBatch, RaggedKVBatch], ids=["holes", "ragged"])




def _scratch_logits(model, prefix: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([prefix])).logits[0, -1].float()


def _greedy(model, prefix: list[int], n: int) -> list[int]:
    ids, out = list(prefix), []
    for _ in range(n):
        t = int(_scratch_logits(model, ids).argmax())
        out.append(t)
        ids.append(t)
    return out


@LAYOUTS
def test_fork_decodes_like_from_scratch(micro_policy, layout):
    model, tok, fmt, spec = micro_policy
    kv = layout(model, 2, fmt.pad_id)
    kv.keep_hidden = True
    a = list(range(10, 40))
    b = list(range(50, 62))
    kv.extend([a, b])
    # grow rows unevenly so the cache has holes, then more tokens after the fork point
    kv.extend([list(range(100, 107)), None])
    kv.extend([None, [7, 8, 9]])
    full_a = a + list(range(100, 107))
    for prefix_len in (1, 5, len(a), len(full_a)):
        new = kv.fork(0, prefix_len)
        assert kv.pending[new] == [full_a[prefix_len - 1]]
        assert int(kv.lengths[new]) == prefix_len - 1
        assert torch.isnan(kv.last_logits[new]).all()  # valid only after the next extend
        chunks = [None] * kv.n
        chunks[new] = []
        kv.extend(chunks)
        prefix = full_a[:prefix_len]
        torch.testing.assert_close(kv.last_logits[new].float(), _scratch_logits(model, prefix),
                                   rtol=1e-4, atol=1e-4)
        assert int(kv.lengths[new]) == prefix_len and kv.tokens[new] == prefix
        # greedy decode from the fork == greedy from scratch
        ids, _ = kv.generate([new], SamplingParams(greedy=True, max_new_tokens=6), stop_ids=())
        assert ids[0] == _greedy(model, prefix, 6)
    # the source rows are untouched by forking
    chunks = [None] * kv.n
    chunks[0], chunks[1] = [3], [4]
    kv.extend(chunks)
    torch.testing.assert_close(kv.last_logits[0].float(), _scratch_logits(model, full_a + [3]),
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kv.last_logits[1].float(), _scratch_logits(model, b + [7, 8, 9, 4]),
                               rtol=1e-4, atol=1e-4)


@LAYOUTS
def test_fork_hidden_state_and_keep(micro_policy, layout):
    model, tok, fmt, spec = micro_policy
    from agentrl_cli.models.sequences import backbone

    kv = layout(model, 3, fmt.pad_id)
    kv.keep_hidden = True
    seqs = [list(range(10, 25)), list(range(30, 34)), list(range(60, 70))]
    kv.extend(seqs)
    new = kv.fork(2, 6)
    chunks = [None] * kv.n
    chunks[new] = [5, 6]
    kv.extend(chunks)
    with torch.no_grad():
        h = backbone(model)(input_ids=torch.tensor([seqs[2][:6] + [5, 6]])).last_hidden_state[0, -1]
    torch.testing.assert_close(kv.last_hidden[new].float(), h.float(), rtol=1e-4, atol=1e-4)
    # drop rows 0 and 2: row `new` keeps decoding exactly; dead cache columns are removed
    width = kv.mask.shape[1]
    kv.keep([1, new])
    assert kv.n == 2 and kv.mask.shape[1] < width
    assert kv.cache.layers[0].keys.shape[0] == 2
    assert kv.cache.layers[0].keys.shape[2] == kv.mask.shape[1]
    kv.extend([[1], [2]])
    torch.testing.assert_close(kv.last_logits[1].float(),
                               _scratch_logits(model, seqs[2][:6] + [5, 6, 2]), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kv.last_logits[0].float(), _scratch_logits(model, seqs[1] + [1]),
                               rtol=1e-4, atol=1e-4)
    # an added empty row takes a whole prefix like a fresh row
    r = kv.add_row()
    chunks = [None] * kv.n
    chunks[r] = seqs[0]
    kv.extend(chunks)
    torch.testing.assert_close(kv.last_logits[r].float(), _scratch_logits(model, seqs[0]),
                               rtol=1e-4, atol=1e-4)


def test_per_row_generators_do_not_depend_on_batch_composition():
    logits = torch.randn(3, 50)
    params = SamplingParams()
    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    t_all, _ = sample_rows(logits, params, gens)
    alone, _ = sample_rows(logits[1:2], params, [torch.Generator().manual_seed(2)])
    assert int(alone[0]) == int(t_all[1])


def test_pack_removes_holes_exactly(micro_policy):
    model, tok, fmt, spec = micro_policy
    kv = KVBatch(model, 3, fmt.pad_id)
    seqs = [list(range(10, 20)), list(range(30, 33)), list(range(60, 66))]
    kv.extend([seqs[0], None, None])
    kv.extend([None, seqs[1], None])
    kv.extend([None, None, seqs[2]])
    kv.extend([[1, 2], [3], None])
    assert kv.mask.shape[1] > int(kv.lengths.max())
    kv.pack()
    assert kv.mask.shape[1] == int(kv.lengths.max()) == 12
    assert kv.cache.layers[0].keys.shape[2] == 12
    assert kv.mask.sum(1).tolist() == kv.lengths.tolist()
    kv.extend([[4], [5], [6]])
    for r, s in enumerate([seqs[0] + [1, 2, 4], seqs[1] + [3, 5], seqs[2] + [6]]):
        torch.testing.assert_close(kv.last_logits[r].float(), _scratch_logits(model, s),
                                   rtol=1e-4, atol=1e-4)


@LAYOUTS
def test_extend_only_fed_rows_is_exact(micro_policy, layout):
    model, tok, fmt, spec = micro_policy
    kv = layout(model, 3, fmt.pad_id)
    kv.keep_hidden = True
    seqs = [list(range(10, 20)), list(range(30, 33)), list(range(60, 66))]
    kv.extend([seqs[0], None, seqs[2]], only_fed=True)
    kv.extend([[1], seqs[1], None], only_fed=True)      # one decode row + one prefill row
    new = kv.fork(0, 4)
    chunks = [None] * kv.n
    chunks[2], chunks[new] = [7, 8], []
    kv.extend(chunks, only_fed=True)
    want = {0: seqs[0] + [1], 1: seqs[1], 2: seqs[2] + [7, 8], new: seqs[0][:4]}
    for r, s in want.items():
        torch.testing.assert_close(kv.last_logits[r].float(), _scratch_logits(model, s),
                                   rtol=1e-4, atol=1e-4)
        assert kv.tokens[r] == s and int(kv.lengths[r]) == len(s)
    kv.pack()
    kv.extend([[2], [3], [4], [5]], only_fed=True)
    for r, s in want.items():
        torch.testing.assert_close(kv.last_logits[r].float(), _scratch_logits(model, s + [r + 2]),
                                   rtol=1e-4, atol=1e-4)


@LAYOUTS
def test_cache_buffers_are_never_read_before_written(micro_policy, monkeypatch, layout):
    """KV buffers are allocated uninitialised: every column a row attends to (or holds as a
    masked hole) must be written first. Poisoning fresh buffers with NaN must leave a FOCUS
    step with forks, parked rows, compaction and sub-batch forwards exactly as it was."""
    from agentrl_cli import config
    from agentrl_cli.engines import hf, kv_batch, kv_cache, kv_ragged
    from agentrl_cli.rollout.controllers import CONTROLLERS, RolloutContext
    from conftest import MICRO, random_value_head

    model, tok, fmt, spec = micro_policy
    head = random_value_head(model)
    algo = config.load(method="focus", sets=MICRO + ["algo.focus_roots=1"]).algo
    tasks = spec.tasks("train", 3)

    def step():
        engine = hf.HFEngine(model, fmt.pad_id)
        engine.ragged = layout is RaggedKVBatch
        assert type(engine.new_batch(0)) is layout
        ctx = RolloutContext(engine, fmt, spec,
                             SamplingParams(max_new_tokens=8), 3, 512, 3, 0,
                             torch.Generator().manual_seed(0), algo=algo, critic=head)
        return CONTROLLERS.get("focus").run(ctx, tasks)

    ref = step()
    assert ref.metrics["focus/continuations"] > 0
    real = kv_cache.new_buffer
    for module in (kv_cache, kv_batch, kv_ragged):        # each module that allocates buffers
        monkeypatch.setattr(module, "new_buffer", lambda *a: real(*a).fill_(float("nan")))
    poisoned = step()
    assert [e.token_ids for e in poisoned.episodes] == [e.token_ids for e in ref.episodes]
    assert all(math.isfinite(x) for e in poisoned.episodes for x in e.logprobs)


def test_compaction_repacks_a_cache_a_quarter_wider_than_its_longest_row(micro_policy):
    """A decode forward attends every column of the cache, holes too: `compact_rows` repacks
    once the cache is more than 1.25 times (plus 32 columns) as wide as its longest row, and
    leaves a narrower one alone (packs cost copies)."""
    from agentrl_cli.rollout.planner import compact_rows

    model, tok, fmt, spec = micro_policy
    kv = KVBatch(model, 2, fmt.pad_id)
    kv.extend([list(range(10, 40)), None], only_fed=True)         # rows fed in turn: each
    kv.extend([None, list(range(40, 70))], only_fed=True)         # feed adds holes to the other
    kv.extend([list(range(70, 90)), None], only_fed=True)
    assert kv.mask.shape[1] == 80 <= 5 * 50 // 4 + 32               # longest row 50
    compact_rows(kv, [], [], share=4)
    assert kv.mask.shape[1] == 80                                   # within the slack: kept
    kv.extend([None, list(range(90, 110))], only_fed=True)
    assert kv.mask.shape[1] == 100 > 5 * 50 // 4 + 32
    compact_rows(kv, [], [], share=4)
    assert kv.mask.shape[1] == 50 == int(kv.lengths.max())
    assert kv.mask.sum(1).tolist() == kv.lengths.tolist() == [50, 50]


def test_a_pack_within_the_buffers_room_moves_in_place_and_stays_exact(micro_policy, monkeypatch):
    """A pack whose buffers already have the room it wants moves every row's real columns to
    the left end of the same buffers (no fresh buffers): the cache must stay exact."""
    from agentrl_cli.engines import kv_batch

    model, tok, fmt, spec = micro_policy
    kv = KVBatch(model, 2, fmt.pad_id)
    seqs = [list(range(10, 30)), list(range(40, 52))]
    kv.extend([seqs[0], None], only_fed=True)
    kv.extend([None, seqs[1]], only_fed=True)
    new = kv.fork(0, 6)                                  # spare rows for forks
    kv.extend([[1, 2, 3], None, None], only_fed=True)
    kv.extend([None, [4], []], only_fed=True)
    want = {0: seqs[0] + [1, 2, 3], 1: seqs[1] + [4], new: seqs[0][:6]}
    before = [layer._kbuf.data_ptr() for layer in kv.cache.layers]
    moves = []
    real_move = kv_batch._move_columns
    monkeypatch.setattr(kv_batch, "_move_columns",
                        lambda src, dst, idx, n: (moves.append(src is dst), real_move(src, dst, idx, n)))
    kv.pack()
    assert moves and all(moves)                          # every layer moved within its buffers
    assert [layer._kbuf.data_ptr() for layer in kv.cache.layers] == before
    assert kv.mask.shape[1] == int(kv.lengths.max())
    kv.extend([[5], [6], [7]], only_fed=True)
    for r, s in want.items():
        torch.testing.assert_close(kv.last_logits[r].float(), _scratch_logits(model, s + [r + 5]),
                                   rtol=1e-4, atol=1e-4)


def test_the_engine_picks_the_ragged_layout_for_full_attention_models(micro_policy):
    from agentrl_cli.engines.hf import HFEngine
    from agentrl_cli.engines.kv_ragged import ragged_layout_fits

    model, tok, fmt, spec = micro_policy
    assert ragged_layout_fits(model.config)
    assert type(HFEngine(model, fmt.pad_id).new_batch(2)) is RaggedKVBatch
    cfg = model.config.__class__(**{**model.config.to_dict(), "use_sliding_window": True,
                                    "sliding_window": 8, "max_window_layers": 0,
                                    "layer_types": ["sliding_attention"] * model.config.num_hidden_layers})
    assert not ragged_layout_fits(cfg)


def test_a_ragged_batch_has_no_holes_and_attends_only_the_fed_rows_columns(micro_policy):
    """Rows fed at different times: each row's tokens stay in its first columns (the mask is
    every row's length, no holes, nothing to pack); a forward of some rows shows the model a
    cache as wide as the longest of them, and every row's logits stay exact."""
    model, tok, fmt, spec = micro_policy
    kv = RaggedKVBatch(model, 4, fmt.pad_id)
    seqs = [list(range(10, 22)), list(range(30, 37)), list(range(60, 75)), list(range(80, 84))]
    for r in range(4):                                   # each row fed alone
        kv.extend([seqs[r] if q == r else None for q in range(4)], only_fed=True)
    assert kv.mask.shape[1] == 15 and kv.mask.sum(1).tolist() == [12, 7, 15, 4]
    new = kv.fork(2, 9)
    widths = []
    real_forward = model.forward

    def spy(*args, **kwargs):
        widths.append(kwargs["attention_mask"].shape[-1])
        return real_forward(*args, **kwargs)

    model.forward = spy
    try:
        kv.extend([[1], None, None, None, []], only_fed=True)    # rows 0 and the fork: gathered
        kv.extend([None, [5, 6, 7], None, None, None], only_fed=True)
        kv.extend([None, None, None, [2], None], only_fed=True)
    finally:
        model.forward = real_forward
    # row 0 and the fork decode: the longer holds 12 tokens, plus one new column (row 2's 15
    # are not attended); then row 1 prefills three tokens after its 7, then row 3 decodes
    assert widths == [len(seqs[0]) + 1, len(seqs[1]) + 3, len(seqs[3]) + 1]
    want = {0: seqs[0] + [1], 1: seqs[1] + [5, 6, 7], 3: seqs[3] + [2], new: seqs[2][:9]}
    for r, s in want.items():
        torch.testing.assert_close(kv.last_logits[r].float(), _scratch_logits(model, s),
                                   rtol=1e-5, atol=1e-5)
        assert kv.tokens[r] == s and int(kv.lengths[r]) == len(s)
    assert kv.mask.sum(1).tolist() == kv.lengths.tolist()
    kv.truncate(2, 5)                                    # a context reset: the row is its prefix
    kv.extend([[3], [4], [8], [9], [11]], only_fed=True)          # every row at once
    want[2] = seqs[2][:5]
    for r, s in want.items():
        nxt = {0: 3, 1: 4, 2: 8, 3: 9, new: 11}[r]
        torch.testing.assert_close(kv.last_logits[r].float(), _scratch_logits(model, s + [nxt]),
                                   rtol=1e-5, atol=1e-5)


def test_rows_that_fill_their_block_run_in_place_and_swaps_keep_every_row_exact(micro_policy):
    """Fed rows that fill most of the rows they span run as that block, in place (the others
    in it computed, not kept): the model sees the block's widest row; `swap` exchanges rows
    whole. Every row's logits stay exact through both."""
    model, tok, fmt, spec = micro_policy
    kv = RaggedKVBatch(model, 5, fmt.pad_id)
    seqs = [list(range(10, 14)), list(range(20, 29)), list(range(30, 46)), list(range(50, 56)),
            list(range(60, 63))]
    for r in range(5):
        kv.extend([seqs[r] if q == r else None for q in range(5)], only_fed=True)
    blocks, widths = [], []
    real_block, real_forward = RaggedKVBatch._forward_block, model.forward

    def spy_block(self, a, b, rows, chunks):
        blocks.append((a, b))
        return real_block(self, a, b, rows, chunks)

    def spy(*args, **kwargs):
        widths.append(kwargs["attention_mask"].shape[-1])
        return real_forward(*args, **kwargs)

    RaggedKVBatch._forward_block, model.forward = spy_block, spy
    try:
        kv.extend([None, [1], None, [2], None], only_fed=True)   # rows 1 and 3 of the block 1..3
    finally:
        RaggedKVBatch._forward_block, model.forward = real_block, real_forward
    assert blocks == [(1, 4)] and widths == [len(seqs[2]) + 1]
    seqs[1], seqs[3] = seqs[1] + [1], seqs[3] + [2]
    for r in (1, 3):
        torch.testing.assert_close(kv.last_logits[r].float(), _scratch_logits(model, seqs[r]),
                                   rtol=1e-5, atol=1e-5)
    kv.swap(0, 2)
    kv.swap(2, 4)                                        # rows now hold seqs 2, 1, 4, 3, 0
    order = [2, 1, 4, 3, 0]
    assert [kv.tokens[r] for r in range(5)] == [seqs[i] for i in order]
    kv.extend([[7]] * 5, only_fed=True)
    for r, i in enumerate(order):
        torch.testing.assert_close(kv.last_logits[r].float(), _scratch_logits(model, seqs[i] + [7]),
                                   rtol=1e-5, atol=1e-5)


def test_a_tree_rollout_keeps_its_running_rows_together(micro_policy, monkeypatch):
    """On a ragged batch the token loop keeps the running paths in the first rows (a started
    path swaps into a row a finished one left, or after the block), so their forwards run as
    one block; the step's episodes are those of the gather path (no blocks)."""
    from agentrl_cli import config
    from agentrl_cli.engines import hf, kv_ragged
    from agentrl_cli.rollout import token_loop
    from agentrl_cli.rollout.controllers import CONTROLLERS, RolloutContext
    from conftest import MICRO, random_value_head

    model, tok, fmt, spec = micro_policy
    head = random_value_head(model)
    algo = config.load(method="focus", sets=MICRO + ["algo.focus_roots=1"]).algo
    tasks = spec.tasks("train", 3)

    def step():
        ctx = RolloutContext(hf.HFEngine(model, fmt.pad_id), fmt, spec,
                             SamplingParams(max_new_tokens=8), 3, 512, 3, 0,
                             torch.Generator().manual_seed(0), algo=algo, critic=head)
        return CONTROLLERS.get("focus").run(ctx, tasks)

    real_tick, seen = token_loop.TokenLoop.tick, []

    def tick(self, running, after_feed=None):
        rows = {p.row for p in running}                   # the block: running rows, and rows
        block = set(range(self.front))                    # finished paths left inside it
        seen.append((rows | self.idle) == block and not rows & self.idle)
        return real_tick(self, running, after_feed)

    monkeypatch.setattr(token_loop.TokenLoop, "tick", tick)
    together = step()
    assert seen and all(seen) and together.metrics["focus/continuations"] > 0
    monkeypatch.setattr(token_loop.TokenLoop, "tick", real_tick)
    monkeypatch.setattr(kv_ragged, "BLOCK_SHARE", 2.0)             # never a block: every sub-batch gathered
    apart = step()
    assert [e.token_ids for e in together.episodes] == [e.token_ids for e in apart.episodes]
