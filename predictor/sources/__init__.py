"""Where execution graphs come from: captured traces (:mod:`.traces`) and model synthesisers (:mod:`.synth`)."""
