"""TP/PP/DP plan search for transformer training (``space: parallel``) and single-plan prediction.

* :mod:`.space` — the ``space: parallel`` YAML schema (model, cluster, global batch, ranges);
* :mod:`.job` — predict one plan: graph + memory + :func:`tuner.cost.evaluate_graph`;
* :mod:`.runner` — the search (grid or Optuna TPE, Ray-parallel, resumable study);
* :mod:`.report` — terminal table, ``results.json`` / ``results.csv``, trace of the best plan.
"""
