"""``round_robin``: one element from each of several datasets in turn, as a DataLoader
interleaves its workers' batches.

Element ``j`` comes from input ``j mod n`` while every input has elements; an input that
runs out leaves the turn and the others go on in the same rotation, until all are empty.
So the order depends only on how many elements each input gives, never on timing, and every
element of every input is delivered once. ``torch.utils.data.DataLoader`` deals an
``IterableDataset``'s worker outputs the same way (worker 0, 1, ..., skipping the ended).

The inputs are pulled synchronously in this thread; each runs ahead on its own where it
has its own threads or process (an ``in_subprocess`` child fills its slots while the
others are read). The state is the next turn, which inputs ended and each input's own state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import SubprocessError
from .dataset import Dataset, dataset_list
from .node import Build, Node


class RoundRobinDataset(Dataset):
    """Elements of ``datasets`` one from each in turn (see the module docstring). ``names``
    (one per input) name an input in the errors that come from it (a process that died)."""

    kind = "round_robin"

    def __init__(self, datasets: Sequence[Dataset], names: Sequence[str] | None = None) -> None:
        self.datasets = dataset_list(datasets, "round_robin")
        self.names = [str(n) for n in names] if names is not None else [f"input {i}" for i in range(len(datasets))]
        if len(self.names) != len(self.datasets):
            raise ValueError(f"round_robin got {len(self.datasets)} datasets but {len(self.names)} names")

    def cardinality(self) -> int | float | None:
        ns = [ds.cardinality() for ds in self.datasets]
        if None in ns:
            return None
        return sum(ns)  # type: ignore[arg-type]

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return _RoundRobinNode(b, self, state)

    def close(self) -> None:
        """Close every input that keeps something between passes (an ``in_subprocess`` child)."""
        for ds in self.datasets:
            close = getattr(ds, "close", None)
            if close is not None:
                close()

    def __repr__(self) -> str:
        return f"round_robin([{', '.join(repr(d) for d in self.datasets)}])"


class _RoundRobinNode(Node):
    def __init__(self, b: Build, ds: RoundRobinDataset, state: Mapping[str, Any] | None) -> None:
        n = len(ds.datasets)
        self.ds = ds
        if state is not None:
            if len(state["inputs"]) != n:
                raise ValueError(f"this state is of a round robin of {len(state['inputs'])} inputs; this one has "
                                 f"{n}: resume with the inputs it was saved with")
            self.turn = int(state["turn"]) % n
            self.ended = [bool(x) for x in state["ended"]]
            self.given = [int(x) for x in state["given"]]
            input_states = list(state["inputs"])
        else:
            self.turn, self.ended, self.given, input_states = 0, [False] * n, [0] * n, [None] * n
        self.inputs: list[Node | None] = [None if self.ended[k] else ds.datasets[k]._build(b, input_states[k])
                                          for k in range(n)]
        super().__init__(b, ds, [x for x in self.inputs if x is not None])
        self.stats.extra["given"] = self.given  # elements per input, as mix's "drawn"

    def _next(self) -> Any:
        n = len(self.inputs)
        for _ in range(n):
            k = self.turn
            node = self.inputs[k]
            self.turn = (k + 1) % n
            if node is None:
                continue
            try:
                x = next(node)
            except StopIteration:
                node.close()
                self.inputs[k], self.ended[k] = None, True
                continue
            except SubprocessError as exc:  # say which input's process it was
                raise SubprocessError(f"{self.ds.names[k]}: {exc}") from exc
            except Exception as exc:
                exc.add_note(f"(from {self.ds.names[k]})")
                raise
            self.given[k] += 1
            return x
        raise StopIteration

    def get_state(self) -> dict:
        return {"turn": self.turn, "ended": list(self.ended), "given": list(self.given),
                "inputs": [x.get_state() if x is not None else None for x in self.inputs]}

    def close(self) -> None:
        for x in self.inputs:
            if x is not None:
                x.close()


__all__ = ["RoundRobinDataset"]
