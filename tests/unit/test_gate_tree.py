"""The condition tree's walks are written once (remote/gate_tree.py): the scanner on the host and the
judging code at home ask the same module, so they cannot drift apart."""

from __future__ import annotations

from gpuops.gates import evaluate, logic
from gpuops.remote import gate_tree, scan_lookup, scan_tree, scan_walker

PRED = {"op": "cap", "atom": {"kind": "pred", "name": "is_sm100_supported"}}
CUDA = {"op": "cap", "atom": {"kind": "cuda", "cmp": ">=", "value": [12, 8]}}
PLATFORM = {"op": "platform", "name": "cuda"}
TP = {"op": "clause", "text": "self.tp_size > 1", "ref": "self.tp_size"}
NNODES = {"op": "clause", "text": "nnodes == 1", "ref": "nnodes"}


def alias(node):
    return {"op": "alias", "name": "_is_x", "expr": node, "scope": "module"}


def test_both_sides_use_the_one_copy():
    assert logic.is_pure_cap is gate_tree.only_atoms
    assert logic.clause_nodes is gate_tree.clause_nodes
    assert evaluate.has_atoms is gate_tree.has_atoms
    assert scan_tree.is_gate_tree is gate_tree.is_gate_tree is scan_lookup.is_gate_tree
    assert scan_walker.only_atoms is gate_tree.only_atoms


def test_a_gpu_test_under_not_and_an_alias_is_pure_and_a_gate():
    tree = {"op": "not", "arg": alias({"op": "or", "args": [PLATFORM, PRED]})}
    assert gate_tree.only_atoms(tree)
    assert gate_tree.is_gate_tree(tree)
    assert gate_tree.clause_nodes(tree) == []


def test_a_clause_anywhere_makes_it_impure_and_is_found_in_order():
    tree = {"op": "and", "args": [alias({"op": "and", "args": [PRED, TP]}), {"op": "not", "arg": NNODES}]}
    assert not gate_tree.only_atoms(tree)
    assert gate_tree.is_gate_tree(tree)
    assert gate_tree.clause_nodes(tree) == [TP, NNODES]


def test_cuda_version_and_platform_tests_are_not_generation_gates():
    tree = {"op": "and", "args": [PLATFORM, CUDA]}
    assert gate_tree.only_atoms(tree)
    assert not gate_tree.is_gate_tree(tree)
    assert gate_tree.has_atoms(tree, ("cap",))
    assert not gate_tree.has_atoms(tree, ("cap", "gen"))
    assert gate_tree.has_atoms(alias(PRED), ("cap", "gen"))
    assert not gate_tree.has_atoms({"op": "or", "args": [TP, NNODES]}, ("cap", "platform"))
