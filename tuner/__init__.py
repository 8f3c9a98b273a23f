from predictor.sources.traces.capture import capture  # noqa: F401  (tuner.capture: record a training loop)
