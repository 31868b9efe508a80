"""``python -m ecospec.tiny build [--force] [--budget full|small|micro]`` / ``python -m ecospec.tiny info``."""

from __future__ import annotations

import argparse
import json
import sys

from ecospec.tiny.build import BUDGETS, STAGES, build, format_summary, status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ecospec.tiny", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build (or reuse) the embedded default")
    p_build.add_argument("--budget", default="full", choices=sorted(BUDGETS))
    p_build.add_argument("--force", action="store_true", help="rebuild every stage")
    p_build.add_argument("--until", choices=[s.name for s in STAGES], help="stop after this stage")
    p_build.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p_build.add_argument("--quiet", action="store_true", help="no progress bars or summary")
    p_info = sub.add_parser("info", help="where the cache is and what is built")
    p_info.add_argument("--budget", default="full", choices=sorted(BUDGETS))
    p_info.add_argument("--json", action="store_true", help="print the full status as JSON")
    args = parser.parse_args(argv)

    if args.command == "build":
        build(args.budget, force=args.force, progress=not args.quiet, until=args.until, threads=args.threads)
        return 0
    st = status(args.budget)
    if args.json:
        print(json.dumps(st, indent=1, default=str))
        return 0
    print(f"ecospec tiny, budget {st['budget']!r}, version {st['version']}: {st['root']}")
    done = {n: s for n, s in st["stages"].items() if s["status"] == "done"}
    for name, s in st["stages"].items():
        print(f"  {name:<10} {s['status']}")
    if done:
        summary = {
            "budget": st["budget"],
            "root": st["root"],
            "stages": {
                n: {"status": "done", "seconds": s["seconds"], "metrics": s["metrics"]} for n, s in done.items()
            },
            "seconds": 0.0,
            "build_seconds": sum(s["seconds"] for s in done.values()),
        }
        print(format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
