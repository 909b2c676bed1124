"""A gate's condition tree: its shape, and the questions both sides ask of it (one copy).

The scanner (``scan_tree.build``, on the host) writes the tree and gpuops (``gpuops.gates.logic``,
``evaluate``, ``patch``, at home) reads it; both import this module, which the scanner's bundle
carries to the host. Host code: stdlib only, Python 3.8+.

Nodes are JSON objects; every one has ``op``, and the scanner adds ``span`` ([line, col, end_line,
end_col]) and ``text``:

- ``{"op": "and" | "or", "args": [node, ...]}``, ``{"op": "not", "arg": node}``
- ``{"op": "cap", "atom": {...}}``: a GPU test; ``atom["kind"]`` is ``pred`` (a predicate call, name
  or attribute), ``cc`` (a capability comparison) or ``cuda`` (a CUDA-version comparison: ``value``
  ``[major, minor]``, or ``[major]`` with ``subject`` ``"major"`` for ``cuda_major < 13``)
- ``{"op": "platform", "name": "cuda" | "hip" | ...}``: which kind of accelerator, not which GPU
- ``{"op": "alias", "name": ..., "expr": node, "scope": ...}``: a name that stands for a condition
- ``{"op": "clause", ...}``: anything else, opaque (``self.tp_size > 1``)
"""


def children(tree):
    """The nodes directly under ``tree``: an and/or's args, a not's arg, an alias's expression; a
    leaf (cap, platform, clause) has none. The one place that says how the tree nests."""
    op = tree.get("op")
    if op in ("and", "or"):
        return tree["args"]
    if op == "not":
        return [tree["arg"]]
    if op == "alias":
        return [tree["expr"]]
    return []


def has_atoms(tree, kinds):
    """Does the tree hold a node whose ``op`` is one of ``kinds``? (``"gen"`` among them narrows
    ``cap`` to generation tests.)"""
    op = tree.get("op")
    if op in kinds:
        if op == "cap" and "gen" in kinds:
            return tree["atom"]["kind"] in ("pred", "cc")
        return True
    return any(has_atoms(child, kinds) for child in children(tree))


def is_gate_tree(tree):
    """A gate tests the GPU generation: a predicate or a capability comparison (not just CUDA-ness)."""
    return has_atoms(tree, ("cap", "gen"))


def only_atoms(tree):
    """Only GPU and platform tests inside (no server, model or other opaque clause)."""
    op = tree.get("op")
    if op in ("cap", "platform"):
        return True
    # A compound node with no children (an empty and/or) holds nothing opaque; a leaf clause does.
    return op in ("and", "or", "not", "alias") and all(only_atoms(child) for child in children(tree))


def clause_nodes(tree):
    """The opaque ``clause`` leaves, left to right, aliases expanded."""
    if tree.get("op") == "clause":
        return [tree]
    return [clause for child in children(tree) for clause in clause_nodes(child)]
