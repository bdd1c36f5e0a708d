"""Jobs: the kinds registry above every kind of job, and the processes that run them.

    kinds.py    JOB_KINDS / ``job_kind``: what each kind (train, audit) does; ``execute`` and ``run_queued``
                run one job inside the store's one lifecycle
    manager.py  the dashboard's JobManager: subprocess workers, queue, standbys, k-seed jobs, cancel; ``preview``
    worker.py   the worker entry (``python -m engine worker RUN_ID``)
    standby.py  a pre-imported worker (``python -m engine.jobs.standby``)
    exiting.py  how the lab's processes end: atexit handlers, then no final garbage collection (~1 s each)
    ray_backend.py  an audit's chunks as Ray tasks (RayChunks), the loopback-only local instance (connect)
    runs.py     run records as the figures read them: labels, seeds, series, formal-DP notes

Layer 8 of data → config → store → models → dp → train → audit → jobs → figures → tools → cli: may import engine.audit, engine.train and everything below them.
"""
