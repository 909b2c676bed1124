"""The gate scanner's statement walks: one walk, two views (functions anywhere; statements of one scope)."""

import ast

from gpuops.remote.scan_ast import functions_in, statements

SOURCE = '''
def outer(mode):
    match mode:
        case "a":
            def under_case():
                x = 1
        case _:
            y = 2
    class K:
        def method(self):
            z = 3
'''


def test_functions_in_finds_functions_under_match_cases_nested_and_methods():
    tree = ast.parse(SOURCE)
    assert sorted(f.name for f in functions_in(tree.body)) == ["method", "outer", "under_case"]


def test_statements_stay_in_one_scope_but_enter_match_cases():
    outer = ast.parse(SOURCE).body[0]
    assigned = {t.id for n in statements(outer.body) if isinstance(n, ast.Assign) for t in n.targets}
    assert assigned == {"y"}  # x is inside under_case, z inside K.method: other scopes
