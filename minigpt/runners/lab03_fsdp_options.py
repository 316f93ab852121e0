"""Lab 03's options run: what FSDP1 (``use_orig_params`` False and True) and FSDP2 hand the optimizer,
which dtype a matmul runs in when autocast and FSDP's mixed precision are both set, CPU offload, the
cost of a checkpoint, and a safetensors export.

    torchrun --nproc_per_node=2 lab/03_fsdp_options.py --report lab/results/03-options-cpu.json
    python lab/03_fsdp_options.py --render lab/results/03-options-cpu.json

It also times a training step and a sharded save of the training state (for the interval between
checkpoints) and exports the model as safetensors, in ``--out-dir``. The measurements are
:mod:`minigpt.fsdp.options`; the page's tables, :mod:`minigpt.pages.lab03_options`.
"""

from __future__ import annotations

import platform
import time

import torch

from minigpt import cli
from minigpt.parallel import launch
from minigpt.runners import entry

PROG = "lab/03_fsdp_options.py"
RESULT_KEYS = ("optimizer", "precedence", "offload", "checkpoint", "export")
DEFAULT_OUT_DIR = "out/lab03-options"


def main(argv: list[str] | None = None) -> int:
    p = cli.torchrun_parser(PROG, __doc__, nproc="2")
    p.add_argument("--report", metavar="FILE", help="write the measurements as JSON here, and its tables beside it")
    p.add_argument("--render", metavar="JSON", help="only render an existing result (no measuring)")
    p.add_argument(
        "--out-dir", default=DEFAULT_OUT_DIR, help=f"folder for the checkpoints it saves (default: {DEFAULT_OUT_DIR})"
    )
    cli.add_device_flag(p)
    args = p.parse_args(argv)
    from minigpt.pages.lab03_options import render

    try:
        if args.render:
            for path in render(cli.input_json(args.render, "--render", RESULT_KEYS, "lab/results/03-options-cpu.json")):
                print(f"wrote {path}")
            return 0
        if args.report is not None:
            cli.output_file(args.report, "--report")
        out_dir = cli.output_dir(args.out_dir, "--out-dir")
        _, _, world_size = launch.torchrun_env()

        def accepts(n: int) -> None:
            cli.need_world_size(n, 2, "sharding needs two ranks or more")

        accepts(world_size)
        where = entry.placement(PROG, args, argv, world_size, accepts)
    except cli.BadInput as exc:
        return cli.refuse(PROG, str(exc))
    ctx = entry.start(args, where, launch.DEFAULT_TIMEOUT_S)
    torch.set_num_threads(1)
    from minigpt.fsdp import options
    from minigpt.train import TrainConfig

    cfg = TrainConfig()
    report = {
        "device": f"{platform.processor() or platform.machine()}, {ctx.backend}",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "world_size": ctx.world_size,
        "optimizer": launch.run(ctx, PROG, lambda: options.what_the_optimizer_sees(cfg, ctx)),
        "precedence": launch.run(ctx, PROG, lambda: options.autocast_precedence(cfg, ctx)),
        "offload": launch.run(ctx, PROG, lambda: options.cpu_offload(cfg, ctx)),
    }
    if ctx.is_main:
        cli.make_parents(out_dir, is_dir=True)
    report["checkpoint"] = launch.run(ctx, PROG, lambda: options.checkpoint_cost(cfg, ctx, out_dir))
    report["export"] = launch.run(ctx, PROG, lambda: options.safetensors_export(cfg, ctx, out_dir))
    launch.teardown()
    if ctx.is_main:
        from minigpt.pages.lab03_options import tables

        print(tables(report, "en")["optimizer"], flush=True)
        if args.report:
            launch.write_report(args.report, report)
            for path in [args.report, *render(args.report)]:
                print(f"[rank 0] wrote {path}", flush=True)
    return 0
