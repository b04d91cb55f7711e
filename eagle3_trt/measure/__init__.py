"""measure: what a bundle will do before it is deployed (alpha, estimator, gate, recommend, cost model, traffic).

It generates through the serving runtime (runtime/loader.py's engine) and reads bundles; servers and
the serving runtime never import it (import-linter: "Servers never import measurement")."""
