"""The NAS-Bench-101 cell example: valid random DAGs, a working forward/backward pass, and the
rank-0 counter file kept across restarts."""

from __future__ import annotations

import json

import pytest
from script_module import load_script

torch = pytest.importorskip("torch")

@pytest.fixture(scope="module")
def nas():
    return load_script("examples/nas_cell.py", "nas_cell")


def reaches(matrix, src, dst):
    seen, todo = {src}, [src]
    while todo:
        i = todo.pop()
        for j, edge in enumerate(matrix[i]):
            if edge and j not in seen:
                seen.add(j)
                todo.append(j)
    return dst in seen


@pytest.mark.parametrize("seed", range(40))
def test_random_cells_are_valid_dags(nas, seed):
    cell = nas.random_cell(seed)
    n = len(cell.ops)
    assert 2 + 2 <= n <= nas.VERTICES
    assert cell.ops[0] == nas.INPUT and cell.ops[-1] == nas.OUTPUT
    assert set(cell.ops[1:-1]) <= set(nas.OPS)
    assert all(cell.matrix[i][j] == 0 for i in range(n) for j in range(i + 1))  # upper-triangular
    assert cell.edges <= nas.MAX_EDGES
    assert reaches(cell.matrix, 0, n - 1)
    for v in range(1, n - 1):  # pruned: every vertex lies on an input→output path
        assert reaches(cell.matrix, 0, v) and reaches(cell.matrix, v, n - 1)


def test_cells_are_seeded_and_varied(nas):
    assert nas.random_cell(5) == nas.random_cell(5)
    assert len({nas.random_cell(s) for s in range(20)}) > 10


def test_prune_drops_dead_vertices_and_rejects_unreachable_output(nas):
    ops = [nas.INPUT, "conv1x1-bn-relu", "maxpool3x3", nas.OUTPUT]
    # 0→1→3, and 2 hangs off 0 with no way out: vertex 2 goes.
    m = [[0, 1, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]]
    cell = nas.prune(m, ops)
    assert cell.ops == (nas.INPUT, "conv1x1-bn-relu", nas.OUTPUT)
    assert cell.matrix == ((0, 1, 0), (0, 0, 1), (0, 0, 0))
    assert nas.prune([[0, 1, 0, 0], [0, 0, 1, 0], [0] * 4, [0] * 4], ops) is None


@pytest.mark.torch
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_forward_backward(nas, seed):
    torch.manual_seed(0)
    model = nas.Network(nas.random_cell(seed))
    x, y = nas.batch(seed, 0, 0, 4)
    out = model(x)
    assert out.shape == (4, 10)
    loss = torch.nn.functional.cross_entropy(out, y)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.torch
def test_training_writes_counters_across_restarts(nas, tmp_path, monkeypatch):
    monkeypatch.setenv("MALLETRAIN_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("MALLETRAIN_JOB_ID", "42")
    args = ["--cell-seed", "2", "--batch", "4", "--log-every", "100"]
    assert nas.main([*args, "--steps", "3"]) == 0
    assert nas.main([*args, "--steps", "5"]) == 0  # resumes at step 3
    counters = json.loads((tmp_path / "ckpt" / nas.COUNTERS_NAME).read_text())
    assert counters["samples"] == 5 * 4 and counters["steps"] == 5
    assert counters["starts"] == 2 and counters["restarts"] == 1
    assert counters["world_sizes"] == [1, 1] and counters["job"] == "42"
    assert not list((tmp_path / "ckpt").glob(".*.tmp"))
