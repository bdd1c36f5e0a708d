"""Training runs: the one loop and the records it writes.

    loop.py     ``prepare`` and ``train``: the one training loop (optimizer, evaluation, store streaming)
    records.py  a run's typed records (plan, evaluations, summary) and their text

Layer 6 of data → config → store → models → dp → train → audit → jobs → figures → tools → cli: may import engine.dp and everything below it.
"""
