"""The execution graph: tasks on processors with typed dependencies.

* :mod:`.execution` — :class:`ExecutionGraph` (columnar tasks and CSR edges) and :class:`GraphBuilder`
* :mod:`.edit` — :class:`GraphEditor`: copy, insert and re-link slices of a graph (what-ifs)
* :mod:`.assemble` — :class:`GraphAssembler`: stamp block templates onto ranks (synthesisers)
"""

from predictor.graph.execution import (
    PARAM_COLUMNS,
    Category,
    DepKind,
    ExecutionGraph,
    GraphBuilder,
    GraphError,
    GraphVocabulary,
    Overhead,
    ProcKind,
)

__all__ = ["PARAM_COLUMNS", "Category", "DepKind", "ExecutionGraph", "GraphBuilder", "GraphError",
           "GraphVocabulary", "Overhead", "ProcKind"]
