"""The `gangshare` command. Each subcommand lives with the component it starts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gangshare import __version__
from gangshare.agent.main import add_agent_command
from gangshare.demo import add_demo_command
from gangshare.dev.cli import add_dev_command
from gangshare.extender.main import add_extender_command
from gangshare.operator.main import add_operator_command
from gangshare.queue_view import add_queue_command
from gangshare.sim.cli import add_simulate_command
from gangshare.whatif import add_plan_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gangshare",
        description="Gang scheduling and GPU sharing for deep-learning training on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"gangshare {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_plan_command(commands)
    add_queue_command(commands)
    add_simulate_command(commands)
    add_dev_command(commands)
    add_operator_command(commands)
    add_extender_command(commands)
    add_agent_command(commands)
    add_demo_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
