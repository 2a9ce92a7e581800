"""Who makes and who reads each value of a lowered graph's nodes: what the rewrites that fold one
node into another (epilogues, hand-over, qkv) ask before they fold."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx


@dataclass
class Wiring:
    """``producer``: the index of the node making each value (a rewrite that moves a node to
    another place updates it); ``readers``: how many node inputs name it; ``answered``: the
    values the graph outputs."""

    producer: dict[str, int]
    readers: dict[str, int]
    answered: frozenset[str]

    @classmethod
    def of(cls, graph: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> Wiring:
        readers: dict[str, int] = {}
        for node in nodes:
            for name in node.input:
                readers[name] = readers.get(name, 0) + 1
        producer = {name: i for i, node in enumerate(nodes) for name in node.output}
        return cls(producer, readers, frozenset(o.name for o in graph.graph.output))

    def maker(self, value: str, reads: int = 1) -> int | None:
        """The index of the node making ``value`` where exactly ``reads`` inputs read it and the
        graph does not answer it (folding the maker into its reader hides nothing), else None."""
        i = self.producer.get(value)
        return None if i is None or self.readers.get(value) != reads or value in self.answered else i
