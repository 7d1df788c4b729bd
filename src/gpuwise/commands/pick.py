"""`gpuwise pick`: choose the freest GPUs and print the CUDA_VISIBLE_DEVICES value."""

from __future__ import annotations

from ..devices import pick
from ..report import console
from .common import add_gpu_selection_arguments, positive_int

HELP = "choose the freest GPU(s), reserve them briefly, print the CUDA_VISIBLE_DEVICES value"
EXAMPLES = """\
  gpus=$(gpuwise pick) && export CUDA_VISIBLE_DEVICES=$gpus
  gpus=$(gpuwise pick -n 2 --min-free 10GiB --max-util 20 --wait 10m) || exit 1   # in a job script
  export CUDA_VISIBLE_DEVICES=$gpus
Not `export CUDA_VISIBLE_DEVICES=$(gpuwise pick)`: export succeeds even when pick fails, and the empty
value it sets hides every GPU from the job.
  gpuwise pick -n 2 --uuid --json
The GPUs stay reserved for --lease (default 60s) so that jobs started at the same moment get
different GPUs; use `gpuwise run -- cmd` to hold them for the whole life of a command.
"""


def add_arguments(p) -> None:
    p.add_argument("-n", "--count", type=positive_int, default=1, help="how many GPUs (default 1)")
    add_gpu_selection_arguments(p)
    p.add_argument("--uuid", action="store_true", help="print UUIDs instead of indices")
    p.add_argument("--lease", default="60s", help="how long the reservation holds (default 60s)")
    p.add_argument("--no-reserve", action="store_true", help="do not reserve the GPUs")


def run(args) -> int:
    def waiting(message: str) -> None:
        console.err.print(f"[dim]waiting: {message}[/dim]")

    result = pick(args.count, min_free=args.min_free, max_util=args.max_util, wait=args.wait, uuid=args.uuid,
                  reserve_for="none" if args.no_reserve else "lease", lease=args.lease, set_env=False,
                  on_wait=waiting, command="gpuwise pick")
    if args.json:
        console.emit_json(result.to_dict())
    else:
        print(result.cuda_visible_devices)
    return 0
