"""The access patterns a ceiling is measured for and a row is placed against, in one table that the ceilings, the
benchmark matrix and the report ask: what one element costs, the method timed beside a case, and their words."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AccessPattern:
    name: str
    inputs: int  # tensors read (memory patterns); 0 for matmul, a rate of operations
    transfers: int  # tensor-sized transfers per element: reads + writes; 0 for matmul
    reference_method: str  # the runtime's own method a CPU bench cell times beside its cases ("" where none)
    words: str  # what one element (or product) costs, as the methodology says it
    finding: str  # how a finding names the ceiling
    headline: str  # the summary's headline of its ceiling
    column: str  # the ceilings table's column of its rate
    unit: str


PATTERNS: dict[str, AccessPattern] = {p.name: p for p in (
    AccessPattern("read", 1, 1, "torch.sum", "one read, a reduction", "read-only", "Read-only bandwidth (ceiling)",
                  "gbps", "GB/s"),
    AccessPattern("copy", 1, 2, "memcpy", "one read and one write", "copy (1 read + 1 write)",
                  "Copy bandwidth (ceiling)", "gbps", "GB/s"),
    AccessPattern("add", 2, 3, "torch.add", "two reads and one write", "add (2 reads + 1 write)",
                  "2 reads + 1 write bandwidth (ceiling)", "gbps", "GB/s"),
    AccessPattern("matmul", 0, 0, "", "2·M·N·K operations per product", "matmul", "Matmul rate (ceiling)", "tflops",
                  "TFLOP/s"),
)}
# The patterns of memory traffic (all but matmul), in the table's order.
MEMORY_PATTERNS = tuple(name for name, p in PATTERNS.items() if p.transfers)
