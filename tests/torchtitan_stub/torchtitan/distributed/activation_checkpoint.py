"""Activation checkpointing policies; each is chosen by its nested ``Config`` class."""

from dataclasses import dataclass


class ActivationCheckpointing:
    @dataclass(kw_only=True, slots=True)
    class Config:
        preserve_rng_state: bool = True


class FullAC(ActivationCheckpointing):
    @dataclass(kw_only=True, slots=True)
    class Config(ActivationCheckpointing.Config):
        pass


class SelectiveAC(ActivationCheckpointing):
    @dataclass(kw_only=True, slots=True)
    class Config(ActivationCheckpointing.Config):
        pass


class MemoryBudgetAC(ActivationCheckpointing):
    @dataclass(kw_only=True, slots=True)
    class Config(ActivationCheckpointing.Config):
        memory_budget: float = 0.5
