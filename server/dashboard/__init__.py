"""Pictures of tuning results: the ``/ui`` pages (:mod:`~server.dashboard.routes`), their HTML
(:mod:`~server.dashboard.pages`), the PNG figures drawn from a
:class:`~server.store.records.TuningRecord` (:mod:`~server.dashboard.figures`) and the
``tiletune report`` file (:mod:`~server.dashboard.report`)."""
