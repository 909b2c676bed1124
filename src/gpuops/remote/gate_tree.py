"""A gate's condition tree: its shape, and the questions both sides ask of it (one copy).

The scanner (``scan_tree.build``, on the host) writes the tree and gpuops (``gpuops.gates.logic``,
``evaluate``, ``patch``, at home) reads it; both import this module, which the scanner's bundle
carries to the host. Host code: stdlib only, Python 3.8+.

Nodes are JSON objects; every one has ``op``, and the scanner adds ``span`` ([line, col, end_line,
end_col]) and ``text``:

- ``{"op": "and" | "or", "args": [node, ...]}``, ``{"op": "not", "arg": node}``
- ``{"op": "cap", "atom": {...}}``: a GPU test; ``atom["kind"]`` is ``pred`` (a predicate call, name
  or attribute), ``cc`` (a capability comparison) or ``cuda`` (a CUDA-version comparison)
- ``{"op": "platform", "name": "cuda" | "hip" | ...}``: which kind of accelerator, not which GPU
- ``{"op": "alias", "name": ..., "expr": node, "scope": ...}``: a name that stands for a condition
- ``{"op": "clause", ...}``: anything else, opaque (``self.tp_size > 1``)
"""


def has_atoms(tree, kinds):
    """Does the tree hold a node whose ``op`` is one of ``kinds``? (``"gen"`` among them narrows
    ``cap`` to generation tests.)"""
    op = tree.get("op")
    if op in kinds:
        if op == "cap" and "gen" in kinds:
            return tree["atom"]["kind"] in ("pred", "cc")
        return True
    if op in ("and", "or"):
        return any(has_atoms(a, kinds) for a in tree["args"])
    if op == "not":
        return has_atoms(tree["arg"], kinds)
    if op == "alias":
        return has_atoms(tree["expr"], kinds)
    return False


def is_gate_tree(tree):
    """A gate tests the GPU generation: a predicate or a capability comparison (not just CUDA-ness)."""
    op = tree.get("op")
    if op == "cap":
        return tree["atom"]["kind"] in ("pred", "cc")
    if op in ("and", "or"):
        return any(is_gate_tree(a) for a in tree["args"])
    if op == "not":
        return is_gate_tree(tree["arg"])
    if op == "alias":
        return is_gate_tree(tree["expr"])
    return False


def only_atoms(tree):
    """Only GPU and platform tests inside (no server, model or other opaque clause)."""
    op = tree.get("op")
    if op in ("cap", "platform"):
        return True
    if op in ("and", "or"):
        return all(only_atoms(a) for a in tree["args"])
    if op == "not":
        return only_atoms(tree["arg"])
    if op == "alias":
        return only_atoms(tree["expr"])
    return False


def clause_nodes(tree):
    """The opaque ``clause`` leaves, left to right, aliases expanded."""
    op = tree.get("op")
    if op == "clause":
        return [tree]
    if op in ("and", "or"):
        return [c for a in tree["args"] for c in clause_nodes(a)]
    if op == "not":
        return clause_nodes(tree["arg"])
    if op == "alias":
        return clause_nodes(tree["expr"])
    return []
