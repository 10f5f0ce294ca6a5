"""``python -m benchmarks.soak_server --fail-decode N [lsp_server's own arguments]``: the server the
soak runs, with one decode that fails from inside the engine.

The N-th request job the decode worker runs raises ``InjectedFault`` at its engine's second stop
check (after the prefill), so the failure path is exercised mid-decode, with the KV cache
borrowed; if that decode ends before a second check, the first one after it that gets that far
fails instead. The hook is passed to the server the product builds (``wrap_request_stop``), which
then runs exactly as ``python -m speculative_complete.lsp_server`` does: the product reads no
setting of the tests.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from speculative_complete.lsp_server.__main__ import main as serve
from speculative_complete.lsp_server.config import Layered
from speculative_complete.lsp_server.scheduler import StopCheck

if TYPE_CHECKING:
    from speculative_complete.lsp_server.server import CompletionServer

log = logging.getLogger(__name__)
FAULT_NOTE = "injected into decode"  # the soak finds the fault in the server's log by these words


class InjectedFault(RuntimeError):
    """The exception raised inside one decode."""


class DecodeFault:
    """Which request job fails (1-based: the ``target``-th, or the first after it whose decode gets
    as far as a second stop check; 0: none); fires once."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.jobs = 0
        self.fired = False

    def wrap(self, should_stop: StopCheck) -> StopCheck:
        """The stop check of the next request job, raising at its second call while armed."""
        self.jobs += 1
        if not self.target or self.fired or self.jobs < self.target:
            return should_stop
        job, calls = self.jobs, 0

        def failing() -> bool:
            nonlocal calls
            calls += 1
            if calls >= 2 and not self.fired:
                self.fired = True
                log.warning("request job %d fails mid-decode", job)
                raise InjectedFault(f"{FAULT_NOTE} {job}")
            return should_stop()

        return failing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.soak_server", add_help=False)
    parser.add_argument("--fail-decode", type=int, required=True, metavar="N")
    args, rest = parser.parse_known_args(argv)
    fault = DecodeFault(args.fail_decode)

    def faulty_server(cli: Layered) -> CompletionServer:
        from speculative_complete.lsp_server.server import create_server

        return create_server(cli, wrap_request_stop=fault.wrap)

    return serve(rest, make_server=faulty_server)


if __name__ == "__main__":
    sys.exit(main())
