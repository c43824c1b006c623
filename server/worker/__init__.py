"""Tuning workers: :mod:`~server.worker.worker` claims jobs from the database and runs the search
(:mod:`autotune.search`) with a :class:`~server.worker.coordinator.JobCoordinator`;
:mod:`~server.worker.tune` runs one local study (``tiletune tune``)."""
