"""``ConfigManager``: the ``--module`` / ``--config`` lookup (a short name is a module of
``torchtitan.models``; else ``MODULE.config_registry``, then ``MODULE``) and the validation of the result."""

import importlib


class ConfigManager:
    def parse_args(self, args):
        module_name, config_name = args[args.index("--module") + 1], args[args.index("--config") + 1]
        if module_name in ("llama3",):
            module = importlib.import_module(f"torchtitan.models.{module_name}.config_registry")
        else:
            module = None
            for candidate in (f"{module_name}.config_registry", module_name):
                try:
                    module = importlib.import_module(candidate)
                    break
                except ImportError:
                    continue
            if module is None:
                raise ImportError(f"Cannot import module '{module_name}'")
        fn = getattr(module, config_name, None)
        if fn is None or not callable(fn):
            raise ValueError(f"Config function '{config_name}' not found")
        config = fn()
        config.__post_init__()  # torchtitan validates the configuration as it parses it (tyro)
        return config
