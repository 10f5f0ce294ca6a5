"""``python -m speculative_complete.decoding.forward.native --build [--variant avx2]``: build the native
kernels (cached)."""

from __future__ import annotations

import argparse
import logging
import sys

from speculative_complete.decoding.forward.native.build import VARIANTS, NativeBuildError, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m speculative_complete.decoding.forward.native", description=__doc__
    )
    parser.add_argument("--build", action="store_true", help="build the kernels if they are not cached")
    parser.add_argument("--variant", default="native", choices=sorted(VARIANTS))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    if not args.build:
        parser.print_help()
        return 0
    try:
        print(build(args.variant))
    except NativeBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
