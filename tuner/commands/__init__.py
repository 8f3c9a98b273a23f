"""One module per ``tuner`` command; :mod:`tuner.cli` registers them."""
