"""Gate scan, the whole run: read the package, load the files that hold a token, share the
definitions, walk every file for gates (serially, or over forked workers: ``scan_workers``), and
build the predicate table. Host code: stdlib only, Python 3.8+."""

import ast
import os

from gpuops.remote.scan_ast import literal_return
from gpuops.remote.scan_callers import call_sites
from gpuops.remote.scan_discovery import walk_python_files
from gpuops.remote.scan_fileinfo import FileInfo, gate_alias_names, load_info, narrow_aliases, parse_file
from gpuops.remote.scan_locator import Locator
from gpuops.remote.scan_lookup import SiteLookups
from gpuops.remote.scan_pieces import FileSource
from gpuops.remote.scan_read import FILE_BYTES_MAX, SCAN_BYTES_MAX, NotRead, TooLarge, read_regular
from gpuops.remote.scan_scope import FunctionContext, Scope
from gpuops.remote.scan_tree import build
from gpuops.remote.scan_values import self_subjects
from gpuops.remote.scan_vocabulary import CAP_NAME_RE, TOKENS, has_token
from gpuops.remote.scan_walker import GateWalker, function_locals
from gpuops.remote.scan_workers import run_forked


class Scanner(SiteLookups):
    def __init__(self, root):
        SiteLookups.__init__(self)
        self.root = root
        self.files = {}
        self.defs = {}          # predicate name -> [rel, ...]
        self.method_defs = {}   # predicate name -> {rel, ...} where it is a class method
        self.cc_tables = {}     # rel -> {"vars": {name: subject}, "funcs": {name: subject}}
        self.platform_map = {}
        self.errors = []
        self.texts = {}
        self.predicates = []
        self.parsed_count = None
        self.files_total = 0
        self._walked = set()    # files walked already (site_info reads them as loaded, not grown)

    def is_predicate(self, name):
        return name in self.defs

    def run(self, jobs=1):
        """All gates of the package, sorted, with ids; the predicate table is in ``self.predicates``."""
        self.read_files()
        gates = None
        if jobs > 1 and len(self.texts) >= 16 * jobs and hasattr(os, "fork"):
            gates = run_forked(self, sorted(self.texts), jobs)  # each worker selects from its share
        if gates is None:
            selected = self.select(self.texts)
            self._token_files = sorted(selected)  # every file holding a token: files_naming's narrower search
            self.load(selected, ())
            self.set_tables(self.local_tables())
            self.reload_extra()
            gates = self.walk_all()
            self.predicates = self.predicate_table()
        gates.sort(key=lambda g: (g["file"], g["line"], g["condition"]["span"][1]))
        counters = {}
        for gate in gates:
            key = (gate["file"], gate["function"])
            counters[key] = counters.get(key, 0) + 1
            gate["id"] = "%s::%s#%d" % (gate["file"], gate["function"], counters[key])
        self.errors.sort(key=lambda e: e["file"])
        return gates

    def select(self, rels):
        """The files that hold a token (a plain substring search: fast). Each file is first
        searched lower-cased for the six lower-case spellings: a file without them holds none of
        the eleven tokens (most files: 3,600 of 4,000 on 0.5.23), and one pass to lower-case it
        costs less than the five searches it saves."""
        tokens = [t.encode() for t in TOKENS]
        lowered = sorted({t.lower() for t in tokens})
        found = []
        for rel in rels:
            text = self.texts[rel]
            if any(map(text.lower().__contains__, lowered)) and any(map(text.__contains__, tokens)):
                found.append(rel)
        return found

    def read_files(self, file_max=FILE_BYTES_MAX, scan_max=SCAN_BYTES_MAX):
        """Read the regular ``.py`` files of the tree (``scan_read``); every other one is listed in
        ``errors`` with why it was not read, and the rest of the scan goes on."""
        total = 0
        for rel, path in walk_python_files(self.root):
            self.files_total += 1
            left = scan_max - total
            try:
                text = read_regular(path, min(file_max, left))
            except TooLarge as exc:
                reason = str(exc) if left >= file_max else "not read: the scan's limit of %d bytes in all was reached" % scan_max
                self.errors.append({"file": rel, "error": reason})
                continue
            except NotRead as exc:
                self.errors.append({"file": rel, "error": str(exc)})
                continue
            self.texts[rel] = text
            total += len(text)

    def load(self, rels, extra_names):
        """Parse ``rels`` (again, with more names, when already parsed) and collect their definitions."""
        for rel in rels:
            info = self.files.get(rel)
            if info is None:
                try:
                    text = self.texts[rel].decode("utf-8")
                except UnicodeDecodeError:
                    self.errors.append({"file": rel, "error": "not UTF-8"})
                    continue
                info = FileInfo(FileSource(rel, text, self._text_memo))
            load_info(info, extra_names)
            if info.error:
                self.errors.append({"file": rel, "error": info.error})
                self.files.pop(rel, None)
                continue
            self.files[rel] = info

    def extra_names(self):
        return sorted(n for n in self.defs if not any(t in n for t in TOKENS))

    def local_tables(self):
        """What other files need to know about these: predicate names (and which are class
        methods), platform tables, capability values and functions, per file."""
        return {rel: (sorted(info.predicates), info.platform_map,
                      sorted(n for n, m in info.predicates.items() if m.get("cls")),
                      ({k: v for k, v in info.cc_vars.items() if v}, {k: v for k, v in info.cc_funcs.items() if v}))
                for rel, info in self.files.items()}

    def set_tables(self, per_file):
        self.defs = {}
        self.method_defs = {}
        self.platform_map = {}
        self.cc_tables = {}
        for rel in sorted(per_file):
            names, platform_map, methods, (cc_vars, cc_funcs) = per_file[rel]
            for name in names:
                self.defs.setdefault(name, []).append(rel)
            for name in methods:
                self.method_defs.setdefault(name, set()).add(rel)
            self.platform_map.update(platform_map)
            if cc_vars or cc_funcs:
                self.cc_tables[rel] = {"vars": cc_vars, "funcs": cc_funcs}

    def reload_extra(self):
        """Predicates with names no token covers (rare): parse again where such a name is used,
        only in files already read (a token-less predicate is used where it lives)."""
        extra = self.extra_names()
        if extra:
            names = [n.encode() for n in extra]
            again = [rel for rel in sorted(self.files) if any(n in self.texts[rel] for n in names)]
            self.load(again, extra)

    def walk_all(self):
        gates = []
        extra_words = [n for n in self.defs if not any(t in n for t in TOKENS)]
        for rel in sorted(self.files):
            info = self.files[rel]
            self._walked.add(rel)  # from here on its pieces grow: others read it through site_info
            found = []
            try:
                words = self.flow_names(info)
                if words and not info.whole:
                    before = len(info.pieces)
                    parse_file(info, words)  # the pieces that use them without naming a token
                    if len(info.pieces) != before:
                        info.self_cc = None
                        narrow_aliases(info)
                        words = self.flow_names(info)
                info.source.mark_words(list(TOKENS) + extra_words + words)
                for piece in info.pieces:
                    locator = Locator(info.source, piece)
                    walker = GateWalker(self, info, locator)
                    ctx = FunctionContext(piece.qual, None, {}, {})
                    walker.walk_body(piece.tree.body, ctx, [])
                    found.extend(walker.found)
            except (RecursionError, MemoryError, ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
                # One odd file must not cost the whole report: it is listed as not understood.
                self.errors.append({"file": rel, "error": "scanner could not read it (%s)" % type(exc).__name__})
                continue
            for gate in found:
                if gate["function"] != "<module>":
                    sites = call_sites(self, gate["function"].split(".")[-1], rel, gate["function"])
                    if sites:
                        gate["callers"] = sites  # who calls its function, and inside which tests
            gates.extend(found)
        return gates

    def flow_imports(self, info):
        """Names this file imports that are capability values or functions in their module."""
        found = getattr(info, "_flow_imports", None)
        if found is None:
            scope = Scope(self, info, None)
            found = set(n for n in info.imports if scope.imported(n, "vars") or scope.imported(n, "funcs"))
            info._flow_imports = found
        return found

    def flow_names(self, info):
        """Names that carry a capability in this file without holding a token: module aliases of
        gates, capability values and functions (its own and imported), ``self`` attributes set to one."""
        names = set(gate_alias_names(info))
        names.update(n for n, v in info.cc_vars.items() if v)
        names.update(info.cc_funcs)
        names.update(self.flow_imports(info))
        names.update(self_subjects(Scope(self, info, None)))
        return sorted(n for n in names if len(n) > 2 and not any(t in n for t in TOKENS))

    def predicate_table(self):
        out = []
        for rel in sorted(self.files):
            info = self.files[rel]
            for name, meaning in sorted(info.predicates.items()):
                entry = {"name": name, "file": rel, "line": meaning.get("line"), "source": meaning.get("source")}
                if "majors" in meaning:
                    entry["majors"] = meaning["majors"]
                    entry["min_cuda"] = meaning.get("min_cuda")
                elif "same_as" in meaning:
                    entry["same_as"] = meaning["same_as"]
                elif "def_node" in meaning:
                    entry["expr"] = self.definition_tree(info, *meaning["def_node"])
                if meaning.get("cls"):
                    entry["cls"] = meaning["cls"]
                out.append(entry)
        return out

    def definition_tree(self, info, func, body, locator):
        """The condition a short predicate returns, with its early returns folded in:
        ``if not cls.is_cuda_static(): return False`` then ``return cap[0] == 10`` is
        ``is_cuda and cap[0] == 10``."""
        func._gpuops_line0 = locator.line0
        local_aliases, cc_vars, params, assigned = function_locals(func, self, info, locator)
        fn = FunctionContext(func.name, None, local_aliases, cc_vars, params, assigned)
        scope = Scope(self, info, locator, local_aliases, cc_vars, fn)
        tree = build(body[-1].value, scope)
        for stmt in reversed(body[:-1]):
            if not isinstance(stmt, ast.If):
                continue
            test = build(stmt.test, scope)
            if literal_return(stmt.body[0]):
                tree = {"op": "or", "args": [test, tree], "span": test["span"], "text": test.get("text")}
            else:
                tree = {"op": "and", "args": [{"op": "not", "arg": test, "span": test["span"], "text": test.get("text")},
                                              tree], "span": test["span"], "text": test.get("text")}
        mark_argument_clauses(tree, [p for p in params if p not in ("self", "cls")])
        return tree


def mark_argument_clauses(tree, params):
    """Mark the clauses of a predicate's definition that test only what its caller passes
    (``dtype in (torch.bfloat16, torch.float16)``, ``device.type == "cuda"``): they are the call's
    ordinary conditions, not a part of the GPU test gpuops cannot read. A clause that names a
    capability (``arch in SUPPORTED``, ``min_capability``) stays unreadable."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if node.get("op") == "clause":
            refs = [str(node.get(k)) for k in ("ref", "value_ref") if node.get(k)]
            text = str(node.get("text") or "")
            if node.get("ref") and str(node["ref"]).split(".")[0] in params and not has_token(text, ()) \
                    and not any(CAP_NAME_RE.search(part) for ref in refs for part in ref.split(".")):
                node["argument"] = str(node["ref"]).split(".")[0]
            continue
        for value in node.values():
            if isinstance(value, dict):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, dict))
