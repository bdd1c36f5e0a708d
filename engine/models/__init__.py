"""The models and what is measured on them.

    nets.py     LR, MLP, Papernot tanh CNNs, DP-compatible ResNet-18 (``build_model``)
    metrics.py  per-tier / per-class metrics, MID markers, fairness metrics, the one recall AUC

Layer 4 of data → config → store → models → dp → train → audit → jobs → figures → tools → cli: may import engine.config, engine.store and engine.data.
"""
