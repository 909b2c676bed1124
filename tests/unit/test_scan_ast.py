"""The gate scanner's statement walks: one walk, two views (functions anywhere; statements of one scope)."""

import ast

from gpuops.remote.scan_ast import (
    NO_VALUE, child_nodes, functions_in, is_literal, jsonable, last_name, literal, statements, walk, walk_no_nested,
)

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


WALKED = '''
@deco(arg=lambda q: q + 1)
def f(a, *, b=2, **kw):
    x, (y, z) = a[1:2], (b, {k: v for k, v in kw.items() if v})
    with open(a) as fh, lock:
        try:
            return [i async for i in g(x)] if y else -z
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"{exc!r:>10}") from exc
        finally:
            del x
    match a:
        case {"k": [1, *rest]} if rest:
            pass
class C(Base, metaclass=M):
    attr: int = 3
'''


def test_fast_walks_visit_the_nodes_of_the_ast_module_walks_in_the_same_order():
    # The scanner's output depends on walk order (the first math mode a name picks, the first
    # partial(...) of a value): the fast walks must be the ast module's own, node for node.
    tree = ast.parse(WALKED)
    assert [type(n) for n in walk(tree)] == [type(n) for n in ast.walk(tree)]
    assert all(a is b for a, b in zip(walk(tree), ast.walk(tree), strict=True))
    for node in ast.walk(tree):
        assert child_nodes(node) == list(ast.iter_child_nodes(node))


def _walk_no_nested_by_the_ast_module(body):
    stack = list(body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def test_walk_no_nested_keeps_its_order_and_stays_out_of_nested_scopes():
    func = ast.parse(WALKED).body[0]
    expected = list(_walk_no_nested_by_the_ast_module(func.body))
    assert walk_no_nested(func.body) == expected
    assert not any(isinstance(n, ast.arg) and n.arg == "q" for n in walk_no_nested(ast.parse(WALKED).body))


def _literal_by_literal_eval(node):
    """scan_ast.literal as it was before its shortcuts: always through ast.literal_eval."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if isinstance(node, ast.Call) and last_name(node.func) in ("frozenset", "set", "tuple", "list") \
                and len(node.args) == 1:
            return _literal_by_literal_eval(node.args[0])
        return NO_VALUE
    return jsonable(value)


LITERALS = '''(1, -2, 3.5, 1 + 2j, "s", b"b", None, True, ..., set(), frozenset({1, 2}), tuple([3, 4]),
 {"a": [1, (2, 3)], 4: {5}}, x, a.b, t[0], f(1), set(x), x < 1, x and y, a if b else 1, lambda: 1,
 f"{x}", -x, not x, [x], {**x})'''


def test_literal_and_is_literal_answer_as_literal_eval_does():
    nodes = list(ast.walk(ast.parse(LITERALS)))
    nodes += list(ast.walk(ast.parse(WALKED)))
    exprs = [n for n in nodes if isinstance(n, ast.expr)]
    assert len(exprs) > 100
    for node in exprs:
        expected = _literal_by_literal_eval(node)
        assert literal(node) == expected or (literal(node) is NO_VALUE and expected is NO_VALUE), ast.dump(node)
        assert is_literal(node) is (expected is not NO_VALUE)
        assert is_literal(node) is (expected is not NO_VALUE)  # asked again: the kept answer
