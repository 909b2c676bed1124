"""The HTTP surface of an SGLang release, read from its own source (stdlib only, Python 3.8+;
imports nothing from gpuops): the routes its ``srt/entrypoints/http_server.py`` serves, and the
fields its ``/server_info`` reports (``server_arg_fields``).

Read, never imported (importing SGLang starts CUDA and takes seconds). Used on both sides: the
server client on the host (``sglang_server``: which of ``/server_info`` and ``/get_server_info`` this
release answers), the lab's stand-in (a copied sibling, ``lab/hosts.STANDIN_SIBLINGS``: it answers
the routes of the release installed on its host) and the tests that hold the stand-in to a release.

What counts as a route, as FastAPI registers it:
  * ``@app.get(PATH)`` / ``post`` / ``put`` / ``delete`` / ``head`` / ``patch`` / ``websocket`` and
    ``@app.api_route(PATH, methods=[...])`` (GET when no methods are given), at any depth (0.5.23
    registers some inside ``if``); a PATH of ``os.environ.get("NAME", "/default")`` is its default;
  * the routes of a router the file includes (``app.include_router(NAME)`` with ``NAME`` imported
    as ``from sglang.x.y import router as NAME``): read from that module's file the same way
    (``/v1/loads`` lives in ``v1_loads.py``);
  * ``/metrics``, mounted at start-up by ``add_prometheus_middleware`` when the server runs with
    ``--enable-metrics``: a route with ``needs="enable_metrics"``.
"""

import ast
import os

HTTP_SERVER = os.path.join("srt", "entrypoints", "http_server.py")
_METHODS = ("get", "post", "put", "delete", "head", "patch", "websocket")


class Route(object):
    __slots__ = ("methods", "path", "line", "file", "needs", "deprecated")

    def __init__(self, methods, path, line, file, needs=None, deprecated=False):
        self.methods = tuple(methods)
        self.path = path
        self.line = line
        self.file = file
        self.needs = needs  # a server setting the route exists only with (``enable_metrics``)
        self.deprecated = deprecated

    def as_record(self):
        return {"methods": list(self.methods), "path": self.path, "file": self.file, "line": self.line,
                "needs": self.needs, "deprecated": self.deprecated}

    def __repr__(self):
        return "Route(%s %s @%s:%s)" % ("|".join(self.methods), self.path, self.file, self.line)


def _path_of(node):
    """A decorator's path argument: a string, or ``os.environ.get("NAME", "/default")``'s default."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Str):  # Python 3.7 hosts
        return node.s
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and len(node.args) == 2):
        return _path_of(node.args[1])
    if isinstance(node, ast.Name):
        return None  # a variable (0.5.23's _ollama_root_route): resolved by _assigned_paths
    return None


def _assigned_paths(tree):
    """``name = "/path"`` or ``name = os.environ.get("X", "/path")`` at module level: paths by name."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            path = _path_of(node.value)
            if path is not None and path.startswith("/"):
                found[node.targets[0].id] = path
    return found


def _methods_of(call, method):
    if method == "api_route":
        for keyword in call.keywords:
            if keyword.arg == "methods" and isinstance(keyword.value, (ast.List, ast.Tuple)):
                names = [_path_of(e) for e in keyword.value.elts]
                return tuple(n.upper() for n in names if n)
        return ("GET",)
    return (method.upper(),)


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _statements(nodes):
    """Every statement of ``nodes`` and of the blocks inside them (``if``, ``try``, functions,
    classes), at any depth, without walking into expressions: routes, imports and
    ``include_router`` calls are statements, and a whole-tree walk of http_server.py's expressions
    took most of a second (every stand-in start and every ``ServerClient.for_process``)."""
    for node in nodes:
        yield node
        for name in _BLOCKS:
            inner = getattr(node, name, None)
            if isinstance(inner, list):
                for found in _statements(inner):
                    yield found


def routes_in_source(text, owners=("app",), file_name="http_server.py"):
    """Every route decorated on one of ``owners`` (``app``, ``router``) in the Python ``text``."""
    tree = ast.parse(text)
    names = _assigned_paths(tree)
    routes = []
    for node in _statements(tree.body):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for deco in node.decorator_list:
            if not (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute)
                    and isinstance(deco.func.value, ast.Name) and deco.func.value.id in owners):
                continue
            method = deco.func.attr
            if method not in _METHODS and method != "api_route":
                continue
            if not deco.args:
                continue
            arg = deco.args[0]
            path = names.get(arg.id) if isinstance(arg, ast.Name) else _path_of(arg)
            if path is None:
                continue
            doc = (ast.get_docstring(node) or "").lower()
            routes.append(Route(_methods_of(deco, method), path, deco.lineno, file_name,
                                deprecated="deprecated" in doc))
    return routes, tree


def _included_routers(tree):
    """Module names of the routers ``app.include_router(NAME)`` adds (``from M import router as NAME``)."""
    imported = {}
    statements = list(_statements(tree.body))
    for node in statements:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if alias.name == "router":
                    imported[alias.asname or alias.name] = node.module
    modules = []
    for statement in statements:
        node = statement.value if isinstance(statement, ast.Expr) else None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "include_router"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "app" and node.args
                and isinstance(node.args[0], ast.Name) and node.args[0].id in imported):
            modules.append(imported[node.args[0].id])
    return modules


def _mounts_metrics(text):
    return "add_prometheus_middleware(" in text


def release_routes(root):
    """The routes of the SGLang package at ``root`` (the ``sglang/`` directory): a list of
    ``Route``; raises OSError when its ``http_server.py`` cannot be read, SyntaxError when it is not
    Python."""
    main_file = os.path.join(root, HTTP_SERVER)
    with open(main_file, "r", encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    rel = "sglang/" + HTTP_SERVER.replace(os.sep, "/")
    routes, tree = routes_in_source(text, ("app",), rel)
    for module in _included_routers(tree):
        if not module.startswith("sglang."):
            continue
        parts = module.split(".")[1:]
        path = os.path.join(root, *parts) + ".py"
        try:
            with open(path, "r", encoding="utf-8", errors="replace") as handle:
                inner = handle.read()
            found, _ = routes_in_source(inner, ("router",), "sglang/" + "/".join(parts) + ".py")
        except (OSError, SyntaxError, ValueError):
            continue  # an included router that cannot be read: its routes are unknown, the rest stand
        routes.extend(found)
    if _mounts_metrics(text):
        line = next((i + 1 for i, row in enumerate(text.splitlines()) if "add_prometheus_middleware(app" in row), 0)
        routes.append(Route(("GET",), "/metrics", line, rel, needs="enable_metrics"))
    return routes


def route_paths(routes, method="GET"):
    """The paths of ``routes`` that answer ``method`` (a set)."""
    return set(r.path for r in routes if method in r.methods)


def _class_fields(cls):
    """{name: default} of a class body's annotated fields (a default that is not a literal: None)."""
    fields = {}
    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and not item.target.id.startswith("_"):
            default = None
            if item.value is not None:
                try:
                    default = ast.literal_eval(item.value)
                except ValueError:
                    default = None
            fields[item.target.id] = default
    return fields


def _parse_file(path):
    with open(path, "r", encoding="utf-8", errors="replace") as handle:
        return ast.parse(handle.read())


def server_arg_fields(root):
    """``{field: default}`` of the release's server arguments, as ``/server_info`` reports them."""
    tree = _parse_file(os.path.join(root, "srt", "server_args.py"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            fields = _class_fields(node)
            if fields:
                return fields
    fields = {}
    folder = os.path.join(root, "srt", "arg_groups", "fields")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        if not name.endswith(".py"):
            continue
        for node in _parse_file(os.path.join(folder, name)).body:
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(i, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_NS_PATH" for t in i.targets)
                    for i in node.body):
                fields.update(_class_fields(node))
    return fields


def reports_launch_command(root):
    """Whether the release's ``/server_info`` carries ``launch_command`` (set by ``build_server_info``)."""
    for rel in (("srt", "utils", "common.py"), ("srt", "utils.py"), ("srt", "entrypoints", "http_server.py")):
        path = os.path.join(root, *rel)
        try:
            with open(path, "r", encoding="utf-8", errors="replace") as handle:
                if '"launch_command"' in handle.read():
                    return True
        except OSError:
            continue
    return False


def _functions(tree, name):
    return [node for node in _statements(tree.body)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name]


def _str_value(node):
    path = _path_of(node)
    return path if isinstance(node, (ast.Constant, ast.Str)) else None


def answer_keys(root, function):
    """The keys of what the release's route handler ``function`` (in http_server.py) answers: the
    string keys of its dict literals, and the names spread into them (``**x.scheduler_info`` gives
    "scheduler_info"). Empty when the handler builds no dict literal (it returns another's)."""
    keys = []
    for func in _functions(_parse_file(os.path.join(root, HTTP_SERVER)), function):
        for node in ast.walk(func):
            if not isinstance(node, ast.Dict):
                continue
            for key, value in zip(node.keys, node.values):
                if key is None and isinstance(value, ast.Attribute):
                    keys.append(value.attr)
                elif key is not None and _str_value(key) is not None and _str_value(key) not in keys:
                    keys.append(_str_value(key))
    return keys


def scheduler_info_keys(root):
    """The keys of the scheduler's start-up info (``"status": "ready"``, ``max_total_num_tokens``,
    ...), which ``/server_info`` spreads into its answer: the dict literal in ``scheduler.py`` that
    holds ``max_req_input_len``."""
    tree = _parse_file(os.path.join(root, "srt", "managers", "scheduler.py"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [_str_value(k) for k in node.keys if k is not None]
            if "max_req_input_len" in keys and "status" in keys:
                return keys
    return []


def _annotated_fields(cls):
    return [item.target.id for item in cls.body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)]


def load_snapshot_shape(root):
    """``/v1/loads``' row as the release builds it from ``managers/load_snapshot.py`` (0.5.16+):
    ``{"core": [keys], "sections": {name: [fields]}}``; None for a release without that file
    (0.5.8's ``entrypoints/v1_loads.py`` builds its rows and an ``aggregate`` itself)."""
    path = os.path.join(root, "srt", "managers", "load_snapshot.py")
    if not os.path.isfile(path):
        return None
    tree = _parse_file(path)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    core = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_CORE_KEYS" for t in node.targets)
                and isinstance(node.value, (ast.Tuple, ast.List))):
            core = [_str_value(e) for e in node.value.elts if _str_value(e)]
    sections = {}
    snapshot = classes.get("LoadSnapshot")
    for item in snapshot.body if snapshot else ():
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        names = [n.id for n in ast.walk(item.annotation) if isinstance(n, ast.Name) and n.id in classes]
        if names:
            sections[item.target.id] = _annotated_fields(classes[names[0]])
    return {"core": core, "sections": sections}


def refused_routes(root):
    """``{path: (status, detail)}`` for the routes whose handler only raises ``HTTPException``
    (0.5.16's ``/weight_version``: 404, "deprecated. Please use '/model_info' instead.")."""
    tree = _parse_file(os.path.join(root, HTTP_SERVER))
    refused = {}
    for node in _statements(tree.body):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        if not (len(body) == 1 and isinstance(body[0], ast.Raise) and isinstance(body[0].exc, ast.Call)):
            continue
        call = body[0].exc
        if not (isinstance(call.func, ast.Name) and call.func.id == "HTTPException"):
            continue
        words = {k.arg: k.value for k in call.keywords}
        status = words.get("status_code")
        if not (isinstance(status, ast.Constant) and isinstance(status.value, int)):
            continue
        detail = _str_value(words["detail"]) if "detail" in words else None
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call) and deco.args and _path_of(deco.args[0]):
                refused[_path_of(deco.args[0])] = (status.value, detail or "")
    return refused


_COLLECTORS = (("srt", "observability", "metrics_collector.py"), ("srt", "metrics", "collector.py"))


def metric_names(root):
    """The ``sglang:`` series names the release's metrics collector declares (a set; empty when
    its collector cannot be read)."""
    import re

    names = set()
    for rel in _COLLECTORS:
        try:
            with open(os.path.join(root, *rel), "r", encoding="utf-8", errors="replace") as handle:
                names.update(re.findall(r'name="(sglang:[A-Za-z0-9_]+)"', handle.read()))
        except OSError:
            continue
    return names


def find_root():
    """The ``sglang`` package directory this python would import (found, not imported), or None."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("sglang")
    except Exception:
        return None
    for location in list(spec.submodule_search_locations or []) if spec else []:
        if os.path.isfile(os.path.join(location, "__init__.py")):
            return location
    return None
