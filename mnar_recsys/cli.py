"""Command line: `mnar-recsys SUBCOMMAND ...`; each pipeline module registers its own subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys

from mnar_recsys.allocator import keep_freed_memory
from mnar_recsys.denormals import flush_denormals
from mnar_recsys.training.trainer import TrainingDiverged

# each module defines register(subparsers) which adds a parser whose `run` default takes the args
PIPELINES = ("mnar_recsys.pipelines.demo", "mnar_recsys.pipelines.ratings", "mnar_recsys.pipelines.uci",
             "mnar_recsys.pipelines.uci_table", "mnar_recsys.pipelines.svhn", "mnar_recsys.pipelines.convert")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mnar-recsys", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in PIPELINES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    keep_freed_memory()
    flush_denormals()  # before torch starts its threads: they inherit it (mnar_recsys.denormals)
    try:
        return int(args.run(args) or 0)
    except (ValueError, OSError, TrainingDiverged) as error:  # OSError: files and folders, named in its message
        print(f"mnar-recsys {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
