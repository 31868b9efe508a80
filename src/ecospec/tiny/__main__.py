"""``python -m ecospec.tiny info`` says which embedded default is in use (the release or a cache build);
``build [--force] [--strict] [--budget full|small|micro]`` retrains into the cache (the full budget: then compared
with the release); ``release`` ships a finished full build as the release (``make release-tiny``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ecospec.tiny.budgets import BUDGETS, get_budget
from ecospec.tiny.build import STAGES, build, format_summary, status
from ecospec.tiny.layout import RELEASE_DIR
from ecospec.tiny.release import make_release, read_manifest
from ecospec.tiny.stages import ENV_SOURCE, root_dir, source


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ecospec.tiny", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="train (or reuse) a build in the cache")
    p_build.add_argument("--budget", default="full", choices=sorted(BUDGETS))
    p_build.add_argument("--force", action="store_true", help="rebuild every stage (the full budget: into the cache)")
    p_build.add_argument("--strict", action="store_true", help="fail on the routing check instead of warning")
    p_build.add_argument("--until", choices=[s.name for s in STAGES], help="stop after this stage")
    p_build.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p_build.add_argument("--quiet", action="store_true", help="no progress bars or summary")
    p_info = sub.add_parser("info", help="which embedded default is in use, and what it holds")
    p_info.add_argument("--budget", default="full", choices=sorted(BUDGETS))
    p_info.add_argument("--json", action="store_true", help="print the full status as JSON")
    p_rel = sub.add_parser("release", help="ship the finished full cache build as the release (package data)")
    p_rel.add_argument("--from", dest="src", type=Path, default=None, help="a finished build (default: this cache's)")
    p_rel.add_argument("--threads", type=int, default=None, help="the thread count it was built with (default: its)")
    args = parser.parse_args(argv)

    if args.command == "build":
        if not args.force and source(args.budget) == "release":
            print(
                f"the release is in use ({ENV_SOURCE} unset or 'release'): nothing to build. --force retrains "
                f"it into the cache and compares; {ENV_SOURCE}=cache uses a cache build"
            )
            return 0
        build(
            args.budget,
            force=args.force,
            progress=not args.quiet,
            until=args.until,
            threads=args.threads,
            strict=args.strict,
        )
        return 0
    if args.command == "release":
        src = args.src or root_dir("full")
        m = make_release(src, get_budget("full"), STAGES, threads=args.threads)
        print(
            f"released {src} as {RELEASE_DIR}: identity {m['identity']}, {len(m['files'])} files, "
            f"{m['bytes'] / 1e6:.1f} MB"
        )
        return 0
    st = status(args.budget)
    if args.json:
        print(json.dumps(st, indent=1, default=str))
        return 0
    if st["source"] == "release":
        m = read_manifest()
        by = m["built_by"]
        print(f"ecospec tiny: the release is in use ({ENV_SOURCE}=cache for a cache build): {st['root']}")
        print(
            f"  identity {m['identity']}, {len(m['files'])} files, {m['bytes'] / 1e6:.1f} MB, every sha256 checked; "
            f"built on {by['processor']}, {by['threads']} threads, Python {by.get('python')}"
        )
        cache = root_dir(args.budget)
        print(f"  a cache build {'exists' if (cache / 'target' / 'done.json').exists() else 'does not exist'}: {cache}")
    else:
        print(f"ecospec tiny: a cache build is in use, budget {st['budget']!r}, version {st['version']}: {st['root']}")
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
