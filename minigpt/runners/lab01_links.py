"""Lab 01's link measurements: α and β of this machine's link, the ring all-reduce of Lab 01's buckets
predicted from them and measured, and a hierarchical all-reduce on simulated nodes.

    torchrun --nproc_per_node=4 lab/01_links.py --out lab/results

1. **The link.** Ranks 0 and 1 send messages of :data:`SIZES` bytes (four decades), one way (half
   the median round trip) and both ways at once (each rank sends while it receives, as in a ring
   step). :func:`~minigpt.parallel.links.fit_alpha_beta` fits α and β to each.
2. **Lab 01's buckets.** Each bucket of Lab 01's DDP (MiniGPT, 0.5 MiB cap) is ring-all-reduced by
   ranks 0 and 1 (:mod:`minigpt.parallel.ring`); the median time beside ``2(N-1)(α + S/(Nβ))`` with
   each fit.
3. **Two nodes.** Every rank, in nodes of ``--node-size`` ranks: the flat ring and
   :func:`~minigpt.parallel.links.hierarchical_all_reduce` on MiniGPT's whole gradient. Both must
   give the exact sum (integer-valued numbers, so every order of the additions is exact), and the
   bytes that cross a node boundary must be :func:`~minigpt.parallel.links.crossing_bytes`' counts.

Part 3 is a check (exit 1 when it fails); parts 1 and 2 are a benchmark. The page's tables are drawn
by :mod:`minigpt.pages.lab01_links`.
"""

from __future__ import annotations

import functools
import json
import platform
import statistics
import time

import torch
import torch.distributed as dist

from minigpt import cli
from minigpt.model import GPTConfig, MiniGPT
from minigpt.parallel import launch, links, ring
from minigpt.parallel.ddp import assign_buckets
from minigpt.runners import entry

PROG = "lab/01_links.py"
SIZES = [2**k for k in range(10, 25, 2)]  # 1 KiB to 16 MiB
BUCKET_CAP_MB = 0.5  # Lab 01's default
RESULT = "01-links-cpu.json"
RESULT_KEYS = ("link", "link_both_ways", "buckets", "nodes")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(work, repeats: int, device: torch.device) -> float:
    """The median time of ``work()`` over ``repeats`` calls, after two untimed ones."""
    times = []
    for i in range(repeats + 2):
        _sync(device)
        start = time.perf_counter()
        work()
        _sync(device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def message_seconds(size: int, repeats: int, device: torch.device, both_ways: bool) -> float:
    """Ranks 0 and 1, the median time of one ``size``-byte message: one way (half a round trip), or
    both ways at once, each rank sending while it receives, as a ring step does."""
    peer = 1 - dist.get_rank()
    outgoing = torch.zeros(size // 4, dtype=torch.float32, device=device)
    incoming = torch.empty_like(outgoing)

    def round_trip() -> None:
        for step in (0, 1):
            if step == dist.get_rank():
                dist.send(outgoing, peer)
            else:
                dist.recv(incoming, peer)

    def both() -> None:
        request = dist.isend(outgoing, peer)
        dist.recv(incoming, peer)
        request.wait()

    if both_ways:
        return median_seconds(both, repeats, device)
    return median_seconds(round_trip, repeats, device) / 2


def bucket_bytes() -> list[int]:
    """The sizes of Lab 01's buckets: MiniGPT's gradients at the lab's cap, in the order they are sent."""
    model = MiniGPT(GPTConfig())
    buckets = assign_buckets(model, int(BUCKET_CAP_MB * 2**20))
    return [sum(p.numel() * p.element_size() for _, p in bucket) for bucket in buckets]


def measure_pair(args, ctx: launch.DistContext) -> dict:
    """Parts 1 and 2, on ranks 0 and 1 (the others wait at the barrier)."""
    pair = dist.new_group([0, 1])
    found: dict = {}
    if ctx.rank < 2:
        for way, both in (("link", False), ("link_both_ways", True)):
            seconds = [message_seconds(size, args.repeats, ctx.device, both) for size in SIZES]
            alpha, beta = links.fit_alpha_beta([float(s) for s in SIZES], seconds)
            found[way] = {"sizes": SIZES, "seconds": seconds, "alpha": alpha, "beta": beta}
        found["buckets"] = []
        for size in bucket_bytes():
            tensor = torch.zeros(size // 4, device=ctx.device)  # its sums stay 0, however often reduced
            measured = {
                name: median_seconds(functools.partial(op, tensor, group=pair), args.repeats, ctx.device)
                for name, op in (
                    ("all_reduce", ring.ring_all_reduce),
                    ("reduce_scatter", ring.ring_reduce_scatter),
                    ("all_gather", ring.ring_all_gather),
                )
            }
            predicted = {
                way: links.ring_all_reduce_seconds(size, 2, found[way]["alpha"], found[way]["beta"])
                for way in ("link", "link_both_ways")
            }
            found["buckets"].append(
                {
                    "bytes": size,
                    "measured": measured["all_reduce"],
                    "predicted": predicted,
                    "halves": {k: measured[k] for k in ("reduce_scatter", "all_gather")},
                }
            )
    dist.barrier()
    return found


def measure_nodes(node_size: int, ctx: launch.DistContext) -> dict:
    """Part 3: the flat ring and the hierarchical one on MiniGPT's gradient, every rank."""
    nodes = links.node_groups(node_size)
    numel = sum(p.numel() for p in MiniGPT(GPTConfig()).parameters())

    def ranks_tensor(rank: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(1000 + rank)
        return torch.randint(-1000, 1000, (numel,), generator=generator).float()

    exact = sum(ranks_tensor(r).double() for r in range(ctx.world_size)).float().to(ctx.device)
    mine = ranks_tensor(ctx.rank).to(ctx.device)
    flat, flat_count = mine.clone(), ring.ByteCounter()
    ring.ring_all_reduce(flat, "sum", None, flat_count)
    hier, inside, across = mine.clone(), ring.ByteCounter(), ring.ByteCounter()
    links.hierarchical_all_reduce(hier, nodes, inside, across)
    crossing_sender = ctx.rank % node_size == node_size - 1  # its right neighbour is on the next node
    mine_counts = {
        "flat_sent": flat_count.sent,
        "flat_crossing": flat_count.sent if crossing_sender and nodes.nodes > 1 else 0,
        "inside_sent": inside.sent,
        "across_sent": across.sent,
        "flat_exact": bool(torch.equal(flat, exact)),
        "hierarchical_exact": bool(torch.equal(hier, exact)),
    }
    every: list = [None] * ctx.world_size
    dist.all_gather_object(every, mine_counts)
    size = numel * 4
    return {
        "node_size": node_size,
        "nodes": nodes.nodes,
        "bytes": size,
        "ranks": every,
        "flat_crossing": sum(r["flat_crossing"] for r in every),
        "hierarchical_crossing": sum(r["across_sent"] for r in every),
        "model": links.crossing_bytes(size, ctx.world_size, node_size),
    }


def verdict(nodes: dict) -> list[tuple[str, bool]]:
    """Part 3's criteria: the exact sum both ways, and the crossing bytes of the model."""
    model = nodes["model"]
    return [
        ("flat ring gives the exact sum on every rank", all(r["flat_exact"] for r in nodes["ranks"])),
        ("hierarchical ring gives the exact sum on every rank", all(r["hierarchical_exact"] for r in nodes["ranks"])),
        ("flat ring's bytes across nodes = model", nodes["flat_crossing"] == model["flat_total"]),
        ("hierarchical bytes across nodes = model", nodes["hierarchical_crossing"] == model["hierarchical_total"]),
    ]


def main(argv: list[str] | None = None) -> int:
    p = cli.torchrun_parser(PROG, __doc__, nproc="4")
    p.add_argument("--repeats", type=cli.POSITIVE_INT, default=15, help="timed round trips per size (median)")
    p.add_argument("--node-size", type=cli.POSITIVE_INT, default=2, help="ranks per simulated node (part 3)")
    p.add_argument("--out", default="out", help=f"folder for {RESULT} and its tables")
    p.add_argument("--render", metavar="JSON", help="only render an existing result (no measuring)")
    cli.add_device_flag(p)
    args = p.parse_args(argv)
    from minigpt.pages.lab01_links import render

    try:
        if args.render:
            for path in render(cli.input_json(args.render, "--render", RESULT_KEYS, f"lab/results/{RESULT}")):
                print(f"wrote {path}")
            return 0
        cli.output_dir(args.out, "--out")
        _, _, world_size = launch.torchrun_env()

        def accepts(n: int) -> None:
            cli.need_world_size(n, 2 * args.node_size, f"two nodes of --node-size {args.node_size} ranks at least")
            if n % args.node_size:
                raise cli.BadInput(
                    f"--node-size {args.node_size} does not divide the {n} ranks; give a divisor of {n}, e.g. 2"
                )

        accepts(world_size)
        where = entry.placement(PROG, args, argv, world_size, accepts)
    except cli.BadInput as exc:
        return cli.refuse(PROG, str(exc))
    ctx = entry.start(args, where, launch.DEFAULT_TIMEOUT_S)
    torch.set_num_threads(1)
    result = {
        "device": f"{platform.processor() or platform.machine()}, {ctx.backend}, one thread per process",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "world_size": ctx.world_size,
        "repeats": args.repeats,
        **launch.run(ctx, PROG, lambda: measure_pair(args, ctx)),
        "nodes": launch.run(ctx, PROG, lambda: measure_nodes(args.node_size, ctx)),
    }
    checks = verdict(result["nodes"])
    result["passed"] = all(ok for _, ok in checks)
    if ctx.is_main:
        for what, ok in checks:
            launch.log(ctx, f"{'PASS' if ok else 'FAIL'}     {what}")
        for way in ("link", "link_both_ways"):
            link = result[way]
            launch.log(ctx, f"{way}: alpha {link['alpha'] * 1e6:.1f} us, beta {link['beta'] / 1e9:.2f} GB/s")
        out = cli.make_parents(args.out, is_dir=True)
        path = out / RESULT
        path.write_text(json.dumps(result, indent=2) + "\n")
        for written in [path, *render(path)]:
            launch.log(ctx, f"wrote {written}")
    launch.teardown()
    return 0 if result["passed"] else 1
