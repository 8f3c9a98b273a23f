"""How long each task takes: kernel models (:mod:`.kernels`), platforms and asset packs (:mod:`.platforms`),
and the microbenchmarks that calibrate them (:mod:`.calibration`, :mod:`.calibrate`)."""
