"""The `gpuwise` command: parses arguments, calls the library, renders. Nothing else lives here.

Each subcommand is a module in `gpuwise.commands` defining HELP, EXAMPLES, `add_arguments(parser)`
and `run(args) -> int`. Expected errors (`GpuwiseError`) become one line on stderr and exit code 2;
anything else is an internal error with its traceback under --debug.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from . import __version__
from .errors import GpuwiseError

COMMANDS = ["demo", "gpus", "pick", "run", "estimate", "fit", "measure", "tune", "watch", "launch", "train", "scale", "doctor"]


def _load(name: str):
    try:
        return importlib.import_module(f"gpuwise.commands.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"gpuwise.commands.{name}":
            return None  # a command not built yet
        raise


class _OneLineParser(argparse.ArgumentParser):
    """Bad arguments are one line and exit code 2, like every other bad input (no usage block)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; `only`: with that one subcommand (the others' modules are not imported: ~0.1 s
    of every run, `gpuwise demo`'s imports the most)."""
    parser = _OneLineParser(
        prog="gpuwise",
        description="Make a PyTorch training job use GPUs well: pick, plan, measure, tune, watch, scale.",
        epilog="Run `gpuwise COMMAND --help` for examples. Every command takes --json.",
    )
    parser.add_argument("--version", action="version", version=f"gpuwise {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    common.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else [only]:
        mod = _load(name)
        if mod is None:
            continue
        p = sub.add_parser(name, parents=[common], help=mod.HELP, description=mod.HELP,
                           epilog="examples:\n" + mod.EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv[:1] and argv[0] in COMMANDS else None)
    rest = None
    if argv[:1] and "--" in argv and getattr(_load(argv[0]) if argv[0] in COMMANDS else None, "TRAILING_COMMAND", False):
        # `gpuwise tune [options] -- CMD`: the command is split off first, so that an optional positional
        # before it (tune's WORKLOAD) does not swallow the command's first word
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if rest is not None:
        args.cmd = rest
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    global _QUICK_EXIT
    _QUICK_EXIT = getattr(_load(args.command), "QUICK_EXIT", False)
    try:
        return int(args._run(args) or 0)
    except GpuwiseError as exc:
        print(f"gpuwise {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gpuwise {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if getattr(args, "debug", False):
            raise
        print(f"gpuwise {args.command}: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


_QUICK_EXIT = False  # set by `main` for a command whose module says QUICK_EXIT = True


def run() -> None:
    """The program (the `gpuwise` script, `python -m gpuwise`): `main`, then exit with its status. A command
    that leaves no thread, child process or open file behind when it returns (fit, estimate: their output is
    printed and written by then) exits at once, after flushing: tearing down the ~10^6 objects a 7B fit's
    traces built took ~1.2 s of it (python -X importtime aside, `gpuwise fit ... --gpu rtx4090` 14.1 -> 13.1 s)."""
    status = main()
    if _QUICK_EXIT:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a reader that closed the pipe (`| head`), a closed stream
                pass
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    run()
