"""A stand-in for torchtitan's main branch (pytorch/torchtitan b5bcd76, Aug 2026) in tuner's tests: the
configuration classes and fields tuner writes and reads, the config registry of the Llama 3 flavors and
``ConfigManager``'s ``--module`` / ``--config`` lookup, nothing that trains. Where torchtitan is
installed, ``tests/test_launch_torchtitan_config.py`` runs against it instead."""
