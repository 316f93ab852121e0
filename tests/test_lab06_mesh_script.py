"""Lab 06's mesh script as a learner runs it across two machines: two torchruns of two ranks each
(``--nnodes=2 --nproc_per_node=2`` on localhost, so every rank sees LOCAL_WORLD_SIZE=2 and the HSDP
degrees are resolved from the layout, no flag: shard 2 inside a "node", replicate 2 across), its
report held against numbers this file works out itself from MiniGPT's parameter shapes and the
ring factors; and the HSDP model of minigpt.zero with its replica all-reduce, by hand."""

from __future__ import annotations

import json
import sys
from concurrent.futures import Future
from pathlib import Path

import pytest

from minigpt.model import MiniGPT
from minigpt.parallel import proof
from minigpt.train import TrainConfig
from minigpt.zero import comm
from tests import background
from tests.launcher import free_port
from tests.limits import limit
from tests.test_lab01_script import start
from tests.test_lab05_scripts import parameter_bytes_per_rank

pytestmark = pytest.mark.timeout(300)

SHARD, REPLICATE, DP, TP = 2, 2, 2, 2


def padded_rows(rows: int, parts: int) -> int:
    return -(-rows // parts) * parts


def hsdp_units() -> list[tuple[int, int]]:
    """(padded elements, all-gathers per step) of each FSDP2 unit: the root (the embeddings, the
    tied output layer once, the final norm; kept gathered for backward, so one all-gather) and each
    block (gathered for forward and again for backward). Each parameter's rows padded to a
    multiple of the shard degree."""
    model = MiniGPT(TrainConfig().model_config())

    def padded(params) -> int:
        return sum(padded_rows(p.shape[0], SHARD) * (p.numel() // p.shape[0]) for p in params)

    in_blocks = {id(p) for b in model.blocks for p in b.parameters()}
    root = [p for p in model.parameters() if id(p) not in in_blocks]
    return [(padded(root), 1)] + [(padded(b.parameters()), 2) for b in model.blocks]


def two_nodes(args: list[str], timeout_s: float, script: str = "lab/06_mesh.py", nproc: int = 2) -> list[str]:
    """``script`` on two "machines" of ``nproc`` ranks each (torchrun's static rendezvous on
    localhost); the two launches' stdout, after both ended with status 0."""
    port = free_port()
    nodes = []
    for node in (0, 1):
        launch = ["--nnodes=2", f"--nproc_per_node={nproc}", f"--node_rank={node}", "--master_addr=127.0.0.1"]
        command = [sys.executable, "-m", "torch.distributed.run", *launch, f"--master_port={port}"]
        nodes.append(start([*command, script, *args]))
    outputs = [n.communicate(timeout=limit(timeout_s)) for n in nodes]
    for n, (_, err) in zip(nodes, outputs):
        assert n.returncode == 0, err[-3000:]
    return [out for out, _ in outputs]


def run_mesh_check(folder: Path) -> dict:
    """The check on two "nodes" of two, its report: on the suite's second lane (tests/background.py),
    from collection on; the test that reads it runs last."""
    report = folder / "mesh.json"
    two_nodes(["--check", "--steps", "2", "--quiet", "--report", str(report)], 280)
    return json.loads(report.read_text())


def submit(config: pytest.Config) -> Future:
    return background.launch(config, "mesh_check", "lab06 mesh check on two nodes of two", run_mesh_check)


@pytest.fixture(scope="module")
def mesh_check(request) -> dict:
    return submit(request.config).result(timeout=limit(600))


def test_the_mesh_script_passes_its_check_on_two_nodes_of_two(mesh_check):
    """Two "nodes" of two ranks, 2 steps of each mesh: the degrees found from the layout, the step drift within Lab 01's 1e-5, one DP x TP step equal
    to one process, the bytes of every mesh dimension equal to the count by hand, the model states
    of rank 0 equal to 16 bytes per padded parameter over the shard degree plus AdamW's step counters."""
    r = mesh_check
    assert r["criterion_pass"] and r["world_size"] == 4, {k: r.get(k) for k in ("broken_rulers", "bytes_per_dim")}
    assert set(proof.REPORT_KEYS) <= set(r), sorted(r)
    assert r["mesh"] == {"hsdp": {"replicate": 2, "shard": 2}, "dp_tp": {"dp": 2, "tp": 2}}
    assert r["fp32_max_step_drift"] <= 1e-5 and r["fp64_max_step_drift"] <= 1e-12, r
    assert r["fp32_first_step_logit_diff"] <= 1e-5 and r["fp32_first_step_grad_diff"] <= 1e-5, r
    assert r["pytorch_first_step_logit_diff"] <= 1e-6 and r["same_as_pytorch"], r  # FSDP2 + parallelize_module

    # HSDP: (S-1)/S of every all-gather and reduce-scatter inside the shard group, 2(R-1)/R of each
    # unit's gradient shard (padded / S) across the replicas
    units = hsdp_units()
    shard_bytes = sum(4 * size * (gathers + 1) * (SHARD - 1) / SHARD for size, gathers in units)
    replicate_bytes = sum(4 * size / SHARD * 2 * (REPLICATE - 1) / REPLICATE for size, _ in units)
    expected = {"shard": round(shard_bytes), "replicate": round(replicate_bytes)}
    assert r["bytes_per_dim"] == r["bytes_model_per_dim"] == expected, (r["bytes_per_dim"], expected)

    # model states of rank 0 (it holds whole chunks): 4 + 4 + 8 bytes per padded parameter / S, and
    # AdamW's float32 step count per parameter tensor
    model = MiniGPT(TrainConfig().model_config())
    states = 16 * sum(size for size, _ in units) // SHARD + 4 * len(list(model.parameters()))
    assert r["memory_per_rank"]["measured"] == r["memory_per_rank"]["model"] == states, r["memory_per_rank"]

    # DP x TP: theory page 02's TP bytes for a DP slice of 64 / 2 rows (ring factor 2(2-1)/2 = 1):
    # per block 4 all-reduces of b s h, two more (embedding, output layer), 3 b s for the loss,
    # and the clipping norm's one number; DP: DDP's ring all-reduce of this rank's cut parameters
    cfg, rows = TrainConfig(), TrainConfig().batch_size // DP
    bsh, bs = rows * cfg.block_size * cfg.n_embd * 4, rows * cfg.block_size * 4
    tp_bytes = (4 * cfg.n_layer + 2) * bsh + 3 * bs + 4
    dp_bytes = parameter_bytes_per_rank(TP)  # 2(D-1)/D = 1 for D = 2, whatever the chunks
    d = r["dp_tp"]
    assert d["bytes_per_dim"] == d["bytes_model_per_dim"] == {"dp": dp_bytes, "tp": tp_bytes}, d["bytes_per_dim"]
    assert d["cut_parameter_bytes"] == dp_bytes and d["replicated_bit_identical"], d


def test_unit_collectives_with_replicas_adds_the_replica_all_reduce():
    """minigpt.zero.comm.unit_collectives(replicas=R): per unit, the shard group's all-gathers and
    reduce-scatter, then the all-reduce of the unit's shard over R replicas; replicas=1 unchanged."""
    plain = comm.unit_collectives([10, 6], 3, 2, 4, 4, [False, True], pad=True)
    assert {c.group for c in plain} == {"data"} and len(plain) == 4
    hsdp = comm.unit_collectives([10, 6], 3, 2, 4, 4, [False, True], pad=True, replicas=4)
    assert [(c.op, c.group) for c in hsdp[:3]] == [
        ("all-gather", "shard"),
        ("reduce-scatter", "shard"),
        ("all-reduce", "replica"),
    ]
    replica = [c for c in hsdp if c.group == "replica"]
    assert [c.elements for c in replica] == [5, 3] and all(c.group_size == 4 for c in replica)
    # 2(R-1)/R x 4 bytes x (5 + 3) elements
    assert sum(c.bytes_sent for c in replica) == pytest.approx(2 * 3 / 4 * 4 * 8)
    with pytest.raises(ValueError, match="replicas=2"):
        comm.unit_collectives([10], 0, 2, 4, 4, replicas=2)
