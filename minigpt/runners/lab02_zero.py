"""Lab 02's ZeRO memory and communication model from the command line.

    python lab/02_zero.py memory --params 7.5e9 --dp 64             # the ZeRO paper's model
    python lab/02_zero.py memory --params 7e9 --nodes 4 --gpus-per-node 8 --hsdp
    python lab/02_zero.py memory --params 2851e6 --gpus-per-node 8 --largest-layer 32e6 --deepspeed
    python lab/02_zero.py comm --params 7.5e9 --dp 64 --recipe fp32
    python lab/02_zero.py simulate --workers 4                       # the numpy simulation

A table by stage in human units (decimal: 1 GB = 10^9 bytes, as the ZeRO paper counts), or
``--json`` for exact bytes. Bad input (a size <= 0, a stage that does not exist, degrees that do
not fit the world size) prints one message naming the value and exits with code 2.
"""

from __future__ import annotations

import argparse
import json

from minigpt import cli
from minigpt.zero import analytic as za, comm, memory

PROG = "lab/02_zero.py"


def human(n_bytes: float) -> str:
    """3 significant digits in decimal units: 31.4 GB, 1.88 GB, 512 MB, 0 B."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n_bytes) >= scale:
            value = n_bytes / scale
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    return f"{n_bytes:.0f} B"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append(
            "  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in enumerate(zip(row, widths)))
        )
    return "\n".join(lines)


PARAMS = cli.Number(float, low=0, low_open=True, note="e.g. 7.5e9")  # a count written like 7.5e9: a float
LARGEST_LAYER = cli.Number(float, low=0, note="0: no working buffer")


def _stages(text: str) -> list[int]:
    if text == "all":
        return list(za.STAGES)
    try:
        stages = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: not a list of stages; give e.g. 0,3 or all") from None
    for s in stages:
        if s not in za.STAGES:
            raise argparse.ArgumentTypeError(f"{text}: stage {s} does not exist; the stages are 0 (DDP), 1, 2, 3")
    return stages


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--params", type=PARAMS, required=True, help="parameter count Ψ, e.g. 7.5e9")
    p.add_argument("--dp", type=cli.POSITIVE_INT, help="data-parallel degree N (or give --nodes and --gpus-per-node)")
    p.add_argument("--nodes", type=cli.POSITIVE_INT, help="machines (default 1)")
    p.add_argument("--gpus-per-node", type=cli.POSITIVE_INT, help="devices per machine")
    p.add_argument("--stage", type=_stages, default=list(za.STAGES), help="stages to show: 0,1,2,3 or all")
    p.add_argument(
        "--recipe",
        default="mixed",
        choices=list(memory.RECIPES),
        help="precision recipe (default mixed: 2 + 2 + 12 bytes per parameter)",
    )
    p.add_argument("--hsdp", action="store_true", help="hybrid sharding: shard inside a node, replicate across")
    p.add_argument("--shard-degree", type=cli.POSITIVE_INT, help="HSDP: devices a model is sharded over")
    p.add_argument("--replicas", type=cli.POSITIVE_INT, help="HSDP: number of shard groups")
    p.add_argument("--json", action="store_true", help="exact bytes as JSON")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    mem = sub.add_parser("memory", help="model-state memory per device, by stage")
    _common(mem)
    mem.add_argument(
        "--largest-layer",
        type=LARGEST_LAYER,
        default=0.0,
        help="parameters of the largest layer/unit: the working buffer of stages 2 and 3",
    )
    mem.add_argument("--offload-optimizer", action="store_true", help="optimizer state in host memory")
    mem.add_argument("--offload-params", action="store_true", help="stage 3: weight shards in host memory too")
    mem.add_argument("--deepspeed", action="store_true", help="also print what DeepSpeed's estimators answer")
    for name in ("seq-len", "micro-batch", "hidden", "heads", "layers"):
        mem.add_argument(f"--{name}", type=cli.POSITIVE_INT, help="activations: give all five to add them")
    mem.add_argument("--checkpointing", action="store_true", help="activations with activation checkpointing")
    com = sub.add_parser("comm", help="bytes each device sends per step, by stage")
    _common(com)
    com.add_argument(
        "--no-reshard", action="store_true", help="stage 3: keep weights gathered between forward and backward"
    )
    sim = sub.add_parser("simulate", help="run the numpy simulation and hold it against the model")
    sim.add_argument("--workers", type=cli.POSITIVE_INT, default=4)
    sim.add_argument("--widths", default="16,32,32,8", help="MLP layer widths, input first")
    sim.add_argument("--steps", type=cli.POSITIVE_INT, default=3)
    sim.add_argument("--recipe", default="fp32", choices=["fp32", "mixed"])
    sim.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def world(args: argparse.Namespace) -> tuple[int, int]:
    """(world size, devices per node) from --dp / --nodes / --gpus-per-node (each a positive
    integer, checked when parsed)."""
    nodes, per_node = args.nodes or 1, args.gpus_per_node
    if per_node is not None:
        if args.dp is not None and args.dp != nodes * per_node:
            raise ValueError(
                f"--dp {args.dp} does not equal --nodes {nodes} x --gpus-per-node {per_node} = {nodes * per_node}"
            )
        return nodes * per_node, per_node
    if args.dp is None:
        raise ValueError("give the data-parallel degree: --dp N, or --nodes and --gpus-per-node")
    if args.nodes is not None and args.dp % nodes:
        raise ValueError(f"--dp {args.dp} is not a whole number of devices per node over --nodes {nodes}")
    return args.dp, args.dp // nodes


def degrees(args: argparse.Namespace, n: int, per_node: int) -> tuple[int, int]:
    """(shard degree, replicas): (N, 1) unless HSDP was asked for."""
    if not (args.hsdp or args.shard_degree or args.replicas):
        return n, 1
    return za.hsdp_degrees(n, per_node, args.shard_degree, args.replicas)


def layout(args: argparse.Namespace) -> tuple[int, int, int, int, list[int]]:
    """(world size, devices per node, shard degree, replicas, the stages to show): HSDP shards,
    so it has no stage 0."""
    n, per_node = world(args)
    shard, replicas = degrees(args, n, per_node)
    return n, per_node, shard, replicas, [s for s in args.stage if not (replicas > 1 and s == 0)]


def memory_report(args: argparse.Namespace) -> dict:
    n, per_node, shard, replicas, stages = layout(args)
    rows = {}
    for stage in stages:
        m = memory.device_memory(
            args.params,
            shard,
            stage,
            args.recipe,
            args.largest_layer,
            args.offload_optimizer,
            args.offload_params and stage == 3,
        )
        rows[za.STAGE_NAMES[stage]] = m.as_dict()
    if args.offload_params and 3 not in args.stage:
        raise ValueError("--offload-params needs stage 3 in --stage (only stage 3 shards the weights)")
    report = {
        "params": args.params,
        "world_size": n,
        "shard_degree": shard,
        "replicas": replicas,
        "recipe": args.recipe,
        "largest_layer": args.largest_layer,
        "stages": rows,
    }
    act = [args.seq_len, args.micro_batch, args.hidden, args.heads, args.layers]
    if any(a is not None for a in act):
        if any(a is None for a in act):
            raise ValueError("activations need all of --seq-len, --micro-batch, --hidden, --heads, --layers")
        report["activations"] = memory.activation_bytes(
            args.layers, args.seq_len, args.micro_batch, args.hidden, args.heads, args.checkpointing
        )
    if args.deepspeed:
        report["deepspeed"] = {
            f"stage {s}": [
                vars(r) for r in memory.deepspeed_rows(s, args.params, args.largest_layer, per_node, n // per_node)
            ]
            for s in memory.DEEPSPEED_STAGES
        }
    return report


def print_memory(report: dict) -> None:
    rec = memory.RECIPES[report["recipe"]]
    hsdp = f", HSDP {report['shard_degree']} x {report['replicas']}" if report["replicas"] > 1 else ""
    print(
        f"Ψ = {report['params']:.4g} parameters, N = {report['world_size']}{hsdp}, recipe {rec.name}: {rec.description}"
    )
    headers = ["stage", "weights", "gradients", "optimizer", "working", "per device"]
    offload = any(m["host"] for m in report["stages"].values())
    if offload:
        headers.append("host (per device)")
    rows = []
    for name, m in report["stages"].items():
        row = [name] + [human(m[k]) for k in ("params", "grads", "optimizer", "working", "device")]
        rows.append(row + ([human(m["host"])] if offload else []))
    print(table(headers, rows))
    if "activations" in report:
        print(f"activations (one micro-batch): {human(report['activations'])}")
    if "deepspeed" in report:
        print("\nDeepSpeed's estimators for the same inputs (GiB = 2^30 bytes, as DeepSpeed prints):")
        for stage, estimates in report["deepspeed"].items():
            print(
                table(
                    [f"DeepSpeed {stage}", "per CPU (node)", "per GPU"],
                    [[e["options"], f"{e['cpu'] / 2**30:.2f} GiB", f"{e['gpu'] / 2**30:.2f} GiB"] for e in estimates],
                )
            )


def comm_report(args: argparse.Namespace) -> dict:
    n, _, shard, replicas, stages = layout(args)
    rows = {}
    for stage in stages:
        cs = comm.step_collectives(args.params, stage, shard, replicas, args.recipe, not args.no_reshard)
        t = comm.traffic(cs)
        rows[za.STAGE_NAMES[stage]] = {
            "collectives": comm.describe(cs),
            "inside": t.inside,
            "across": t.across,
            "total": t.total,
            "volume_elements": sum(c.count * za.RING_PASSES[c.op] * c.elements for c in cs),
        }
    return {
        "params": args.params,
        "world_size": n,
        "shard_degree": shard,
        "replicas": replicas,
        "recipe": args.recipe,
        "stages": rows,
    }


def print_comm(report: dict) -> None:
    hsdp = report["replicas"] > 1
    print(
        f"Ψ = {report['params']:.4g} parameters, N = {report['world_size']}"
        + (f", HSDP {report['shard_degree']} x {report['replicas']}" if hsdp else "")
        + f", recipe {report['recipe']}: bytes each device sends per step (ring algorithms)"
    )
    headers = ["stage", "collectives", "volume (x Ψ)"]
    headers += ["inside shard group", "across replicas", "total"] if hsdp else ["sent per device"]
    rows = []
    for name, r in report["stages"].items():
        row = [name, r["collectives"], f"{r['volume_elements'] / report['params']:.3g}"]
        row += [human(r["inside"]), human(r["across"]), human(r["total"])] if hsdp else [human(r["total"])]
        rows.append(row)
    print(table(headers, rows))


def simulate_report(args: argparse.Namespace) -> dict:
    from minigpt.zero import mlp, simulate  # numpy: only when asked for

    try:
        widths = tuple(cli.POSITIVE_INT.parse(w) for w in args.widths.split(","))
    except cli.BadInput:
        raise cli.BadInput(
            f"--widths {args.widths}: not a comma-separated list of positive integers; give e.g. 16,32,32,8"
        ) from None
    spec = mlp.MLPSpec(widths)
    rows = 8 * args.workers if isinstance(args.workers, int) and args.workers > 0 else 8
    rec = memory.recipe(args.recipe)
    runs = [simulate.simulate(s, args.workers, spec, args.steps, args.recipe, rows) for s in za.STAGES]
    padded = [comm.padded(u, args.workers) for u in spec.unit_sizes]
    out = {
        "workers": args.workers,
        "widths": list(widths),
        "params": spec.n_params,
        "padded_params": sum(padded),
        "recipe": args.recipe,
        "stages": {},
    }
    for run in runs:
        predicted = memory.device_memory(sum(padded), args.workers, run.stage, args.recipe, largest_layer=max(padded))
        sent = sum(
            c.bytes_sent
            for c in comm.unit_collectives(spec.unit_sizes, run.stage, args.workers, rec.param_bytes, rec.reduce_bytes)
        )
        out["stages"][za.STAGE_NAMES[run.stage]] = {
            "same_weights_as_ddp": all((a == b).all() for a, b in zip(runs[0].weights, run.weights)),
            "peak_model_state": run.peak_model_state[0],
            "predicted_memory": predicted.device,
            "bytes_sent_per_step": run.bytes_sent_per_step[0],
            "predicted_bytes": sent,
            "final_loss": run.losses[-1],
        }
    return out


def print_simulate(report: dict) -> None:
    print(
        f"{report['workers']} workers, MLP {report['widths']} ({report['params']} parameters, "
        f"{report['padded_params']} padded), recipe {report['recipe']}"
    )
    rows = [
        [
            name,
            "yes" if r["same_weights_as_ddp"] else "NO",
            f"{r['peak_model_state']:,}",
            f"{r['predicted_memory']:,.0f}",
            f"{r['bytes_sent_per_step']:,}",
            f"{r['predicted_bytes']:,.0f}",
        ]
        for name, r in report["stages"].items()
    ]
    print(table(["stage", "weights = DDP's", "peak bytes held", "model", "bytes sent/step", "model"], rows))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "simulate":
            report = simulate_report(args)
            printer = print_simulate
        elif args.command == "memory":
            report, printer = memory_report(args), print_memory
        else:
            report, printer = comm_report(args), print_comm
    except ValueError as exc:
        return cli.refuse(f"{PROG} {args.command}", str(exc))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        printer(report)
    return 0
