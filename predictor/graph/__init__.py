"""The execution graph: tasks on processors with typed dependencies.

* :mod:`.execution` — :class:`ExecutionGraph` (columnar tasks and edge lists) and its vocabulary
* :mod:`.builder` — :class:`GraphBuilder`: appends tasks one by one and stamps block templates onto
  ranks (trace readers, synthesisers)
* :mod:`.edit` — :class:`GraphEditor`: copy, insert and re-link slices of a graph (what-ifs)
"""

from predictor.graph.builder import GraphBuilder, GraphVocabulary
from predictor.graph.execution import (
    PARAM_COLUMNS,
    Category,
    DepKind,
    ExecutionGraph,
    GraphError,
    Overhead,
    ProcKind,
)

__all__ = ["PARAM_COLUMNS", "Category", "DepKind", "ExecutionGraph", "GraphBuilder", "GraphError",
           "GraphVocabulary", "Overhead", "ProcKind"]
