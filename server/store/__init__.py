"""Everything tiletune keeps in its database, one module per concept.

- :mod:`~server.store.db`: engines, the read pool, and :meth:`Database.transaction`,
  the one place work is committed or rolled back;
- :mod:`~server.store.models`: the typed SQLAlchemy models (``tt_*`` tables);
- :mod:`~server.store.migrate`: running the Alembic migrations;
- :mod:`~server.store.workloads`: workload rows and the lookup of a config;
- :mod:`~server.store.records`: trials and tuned configs (history kept), and the
  :class:`~server.store.records.TuningRecord` pictures are drawn from;
- :mod:`~server.store.queue`: tuning jobs, worker leases and trial reservations;
- :mod:`~server.store.tokens`: API tokens, stored hashed.
"""
