"""Benchmarks of tiletune (``tiletune bench ...``): ratios of figures measured side by side in one run.

- :mod:`~server.bench.kernel`: the sparse kernel against its dense anchors;
- :mod:`~server.bench.search`: search strategies replayed on recorded tables, and
  :mod:`~server.bench.verdicts`, the default against the others row by row;
- :mod:`~server.bench.service`: the HTTP service beside a bare route
  (:mod:`~server.bench.seeding`, :mod:`~server.bench.load`);
- :mod:`~server.bench.client`: the library client beside a dict lookup;
- :mod:`~server.bench.workers`: the job queue as worker processes are added;
- :mod:`~server.bench.harness`: the one way tiletune starts its own child processes
  (used by ``tiletune up`` and the tests too).
"""


class BenchError(RuntimeError):
    """A bench that cannot run (bad options, a server that does not start); the message says why."""
