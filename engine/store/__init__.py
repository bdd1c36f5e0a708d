"""The run store and the bottom of the orchestration: what every process that runs or reads runs shares.

    db.py         RunStore: SQLite (WAL) runs, jobs of k seed rows, evaluations, artifacts; read-only opens
    errors.py     StoreError: one line naming the store file
    liveness.py   whether a run's worker process is still alive
    artifacts.py  array artifacts as ``.npy`` bytes (never unpickled)
    lifecycle.py  one run's lifecycle (start → finished / cancelled / failed), Cancelled, SIGTERM, error lines

Layer 3 of data → config → store → models → dp → train → audit → jobs → figures → tools → cli: may import engine.config and engine.data.
"""
