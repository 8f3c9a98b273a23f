from dataclasses import dataclass


@dataclass
class ModelSpec:
    name: str
    flavor: str
    model: object = None
