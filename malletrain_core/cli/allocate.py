"""``malletrain allocate``: solve one allocation problem from a JSON file and show the result."""

from __future__ import annotations

import argparse
import json
import sys

from ..allocator import POLICIES, SOLVERS, policy, solve
from ..allocator.problem_io import load_problem
from ..model import Problem, Solution

HELP = "solve one allocation problem (JSON) and print the node counts"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``allocate`` sub-command."""
    parser = subparsers.add_parser(
        "allocate", help=HELP, description=HELP + ". Example input: "
        '{"nodes": 64, "jobs": [{"id": "j1", "max_nodes": 32, "current_nodes": 4, '
        '"curve": {"nodes": [1, 8, 32], "throughput": [100, 700, 2000]}}]}')
    parser.add_argument("--input", "-i", required=True, metavar="FILE",
                        help="problem file in JSON ('-' reads standard input)")
    parser.add_argument("--solver", choices=list(POLICIES), default="auto",
                        help="auto: dp, or milp when the problem has side constraints "
                             "(default: %(default)s)")
    parser.add_argument("--time-limit", type=float, metavar="SECONDS", dest="time_limit_s",
                        help="time limit for the HiGHS solvers")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--noheader", action="store_true", help="omit the table header")
    parser.set_defaults(func=run)


def format_table(problem: Problem, solution: Solution, header: bool = True) -> str:
    """The squeue-shaped result table followed by one summary line."""
    rows = []
    for job in problem.jobs:
        new = int(solution.counts.get(job.id, 0))
        change = new - job.current_nodes
        rows.append((job.id, str(job.min_nodes), str(job.max_nodes), str(job.current_nodes),
                     str(new), f"{change:+d}" if change else "0"))
    titles = ("JOB", "MIN", "MAX", "CURRENT", "NEW", "CHANGE")
    widths = [max([len(t)] + [len(r[i]) for r in rows]) for i, t in enumerate(titles)]

    def line(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:]))
        return "  ".join((first, *rest)).rstrip()

    out = ([line(titles)] if header else []) + [line(r) for r in rows]
    used = sum(int(k) for k in solution.counts.values())
    summary = (f"objective {solution.objective:.6g} ({problem.objective.value}, look-ahead "
               f"{problem.lookahead_s:g} s); {used} of {problem.nodes} nodes; solver "
               f"{solution.solver} {solution.solve_ms:.1f} ms")
    if solution.status != "optimal":
        summary += f"; {solution.status}, gap {solution.gap:.3%}"
    return "\n".join(out + [summary])


def run(args: argparse.Namespace) -> int:
    """Read, solve, print; errors propagate as MalleTrainError to the dispatcher."""
    problem = load_problem(args.input)
    if args.solver in SOLVERS:
        solution = solve(problem, args.solver, args.time_limit_s)
    else:
        solution = policy(args.solver)(problem)
    if args.json:
        record = solution.to_dict()
        record.update(status=solution.status, gap=solution.gap)
        json.dump(record, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(format_table(problem, solution, header=not args.noheader))
    return 0
