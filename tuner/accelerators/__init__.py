"""``space: accelerators`` — which accelerator (and batch size) trains a model fastest or cheapest.

Centimani (Xie et al., USENIX ATC 2024) as a search: :mod:`.space` (the YAML schema),
:mod:`.evaluate` (trace a model once, then per accelerator: eq. 5 batch size and the decoupled
time model through the simulator and :func:`tuner.cost.evaluate_graph`), :mod:`.runner` (Ray
tasks + Optuna study with resume), :mod:`.report` (terminal table, ``results.json``,
self-contained ``report.html`` with Fig. 7-style normalised bar charts).
"""
