"""Gate scan: meanings that need other files of the tree (a predicate's defining file, a module
constant, another module's alias, a parameter every call site passes the same capability to).
A mixin of ``scan_scanner.Scanner``, whose tables (``texts``, ``files``, ``defs``,
``method_defs``, ``_walked``) it reads; it owns its caches. Host code: stdlib only, Python 3.8+."""

import ast
import re

from gpuops.remote.gate_tree import is_gate_tree, only_atoms
from gpuops.remote.scan_ast import NO_VALUE, last_name, literal_collection, params_of, walk, walk_no_nested
from gpuops.remote.scan_constants import returned_collection
from gpuops.remote.scan_discovery import module_files
from gpuops.remote.scan_fileinfo import FileInfo, collect_definitions, import_in_text, load_info
from gpuops.remote.scan_locator import Locator
from gpuops.remote.scan_pieces import (
    FileSource, Piece, module_ranges, parse_chunk, segment_starts, split_class, split_pieces,
)
from gpuops.remote.scan_scope import FunctionContext, Scope
from gpuops.remote.scan_tree import build, interesting
from gpuops.remote.scan_values import cc_subject, collect_local_cc
from gpuops.remote.scan_vocabulary import TOKENS

_TOKEN_BYTES = tuple(t.encode() for t in TOKENS)


class SiteLookups(object):
    """What a name means across files; every answer cached, keyed so that it does not depend on
    the order files are walked in nor on how they are shared among workers."""

    def __init__(self):
        self._param_cache = {}
        self._trees = {}
        self._module_aliases = {}
        self._light = {}
        self._constant_cache = {}
        self._site_infos = {}   # rel -> FileInfo as loaded (see site_info)
        self._naming = {}       # needle -> the files holding it (see files_naming)
        self._text_memo = {}    # what comes of a file's text alone (scan_pieces.FileSource.memo)
        self._token_files = None  # sorted: the files holding a token, when known for the whole tree (files_naming)

    def files_naming(self, needle):
        """The files (sorted) whose text holds ``needle`` (bytes) anywhere: a substring search of
        the whole tree (60 MB on 0.5.23, ~20 ms a name), kept for a name asked again by another
        lookup (call sites, parameter values, constant methods, subclasses). The list is shared:
        read it, never change it."""
        found = self._naming.get(needle)
        if found is None:
            texts = self.texts
            found = self._naming[needle] = [rel for rel in self._files_that_may_hold(needle) if needle in texts[rel]]
        return found

    def _files_that_may_hold(self, needle):
        """The fewest files (sorted) ``needle`` can be in: those of a part of it already searched
        for, or of a token it holds (``forward_hopper_bf16`` only where ``hopper`` is: 31 files of
        4,000 on 0.5.23) when the files holding a token are known for the whole tree; else all."""
        pool = None
        for known, holders in self._naming.items():
            if known in needle and (pool is None or len(holders) < len(pool)):
                pool = holders
        if self._token_files is not None:
            for token in _TOKEN_BYTES:
                if token in needle:
                    holders = self._naming.get(token)
                    if holders is None:
                        holders = self._naming[token] = [rel for rel in self._token_files if token in self.texts[rel]]
                    if pool is None or len(holders) < len(pool):
                        pool = holders
        return sorted(self.texts) if pool is None else pool

    def resolve_predicate(self, info, name, form="call"):
        """The file whose definition ``name`` means at this place: the module's own function, what
        its import names, else (a method of an object: ``current_platform.is_blackwell()``,
        ``cls.is_sm120()``) the class methods of this file, then of this subpackage."""
        own = info.predicates.get(name)
        method = form in ("method", "attr")
        if own is not None and bool(own.get("cls")) == method:
            return info.rel
        if name in info.imports and not method:
            module, original = info.imports[name]
            for rel in module_files(module):
                if rel in self.defs.get(original, ()):
                    return rel
            name = original
        candidates = self.defs.get(name, [])
        if not candidates:
            return None
        methods = [rel for rel in candidates if rel in self.method_defs.get(name, ())]
        functions = [rel for rel in candidates if rel not in methods]
        ranked = (methods + functions) if method else (functions + methods)
        for test in (lambda rel: rel == info.rel, lambda rel: rel.split("/", 1)[0] == info.top,
                     lambda rel: rel.startswith("srt/utils"), lambda rel: True):
            for rel in ranked:
                if test(rel):
                    return rel
        return None

    def returned_collection(self, info, name):
        """The literal collection the function ``name`` returns at this place (its every return one,
        written out or a module constant), or NO_VALUE: ``scan_constants.returned_collection``."""
        return returned_collection(self, info, name)

    def constant(self, info, name, depth=0):
        """A module-level literal collection (a list of model architectures, a tuple of capabilities,
        a dict's keys) named in a clause or comparison, in this module or imported from another."""
        key = (info.rel, name)
        if key in self._constant_cache:
            return self._constant_cache[key]
        value = NO_VALUE
        imported = info.imports.get(name) or import_in_text(info, name)
        if name in info.aliases:
            value = literal_collection(info.aliases[name][0])
        elif imported and depth < 3:
            module, original = imported
            for rel in module_files(module):
                other = self.site_info(rel) if rel in self.texts else None
                if other is not None:
                    value = self.constant(other, original, depth + 1)
                    break
        else:
            pattern = re.compile(r"^%s\s*(?::[^=]*)?=" % re.escape(name))
            lines = info.source.lines
            starts = [s for s in segment_starts(lines, "") if s >= 0]
            for begin, end in zip(starts, starts[1:] + [len(lines)]):
                if pattern.match(lines[begin]):
                    try:
                        tree = ast.parse("".join(lines[begin:end]))
                        stmt = tree.body[0]
                        value = literal_collection(stmt.value) if getattr(stmt, "value", None) is not None else NO_VALUE
                    except (SyntaxError, ValueError, IndexError):
                        value = NO_VALUE
                    break
        if value is not NO_VALUE and not isinstance(value, list):
            value = NO_VALUE
        self._constant_cache[key] = value
        return value

    def param_subject(self, info, fn, param):
        """The capability subject every call site in the tree passes for ``param`` of ``fn`` (a
        function or method of this file), or None (a call site passes something else, passes
        nothing, or the function is used in a way not seen as a call)."""
        name = fn.qual.split(".")[-1] if fn.qual else None
        key = (info.rel, fn.qual, param)
        if key in self._param_cache:
            return self._param_cache[key]
        self._param_cache[key] = None  # recursion guard
        subject = None
        if name and len(name) > 3 and param in fn.params and not name.startswith("__"):
            subject = self._call_sites_agree(name, fn, param)
        self._param_cache[key] = subject
        return subject

    def module_alias(self, module, name, depth=0):
        """(value node, locator, FileInfo) of ``name`` assigned at module level in ``module`` (or
        imported there, star imports followed), or None."""
        key = (module, name)
        if key in self._module_aliases:
            return self._module_aliases[key]
        self._module_aliases[key] = None
        found = None
        for rel in module_files(module):
            other = self.light_info(rel, name)
            if other is None:
                continue
            if name in other.aliases:
                value, locator = other.aliases[name]
                found = (value, locator, other)
            elif name in other.imports and depth < 4:
                found = self.module_alias(other.imports[name][0], other.imports[name][1], depth + 1)
            elif depth < 4:
                for star in other.star_imports:
                    found = self.module_alias(star, name, depth + 1)
                    if found is not None:
                        break
            break
        self._module_aliases[key] = found
        return found

    def light_info(self, rel, name):
        """A module's definitions (the pieces naming ``name`` or a token), parsed on their own."""
        if rel not in self.texts:
            return None
        key = (rel, name)
        if key not in self._light:
            try:
                info = FileInfo(FileSource(rel, self.texts[rel].decode("utf-8"), self._text_memo))
                info.pieces = split_pieces(info.source, [name, "import"])
                collect_definitions(info)
            except (SyntaxError, ValueError, RecursionError, MemoryError, UnicodeDecodeError):
                info = None
            self._light[key] = info
        return self._light[key]

    def param_predicate(self, info, fn, param):
        """The GPU test every call site in the tree passes for the bool parameter ``param``, as a
        condition tree (spans at the first call site), or None."""
        name = fn.qual.split(".")[-1] if fn.qual else None
        key = (info.rel, fn.qual, param, "predicate")
        if key not in self._param_cache:
            self._param_cache[key] = None
            if name and len(name) > 3 and param in fn.params and not name.startswith("__"):
                self._param_cache[key] = self._call_sites_agree(name, fn, param, predicate=True)
        return self._param_cache[key]

    def _call_sites_agree(self, name, fn, param, predicate=False):
        first = None
        holders = self.files_naming(name.encode())
        if len(holders) > 6:
            return None  # a common name: its call sites are not worth proving
        position = fn.params.index(param)
        subjects = set()
        for rel in holders:
            try:
                info = self.site_info(rel)
                if info is None:
                    raise ValueError("not UTF-8")
                pieces = self.statements_naming(info, name)
            except (SyntaxError, ValueError, RecursionError, MemoryError, UnicodeDecodeError):
                return None
            references = calls = 0
            for piece in pieces:
                tree = piece.tree
                # Every reference to the name must be a call (not a callback, a registry entry, ...).
                references += sum(1 for n in walk(tree) if (isinstance(n, ast.Name) and n.id == name)
                                  or (isinstance(n, ast.Attribute) and n.attr == name))
                sites = self._sites_in_piece(info, piece, name, fn, param, position, predicate)
                if sites is None:
                    return None
                calls += len(sites)
                for subject, argtree in sites:
                    subjects.add(subject)
                    first = first or argtree
                if len(subjects) > 1 or None in subjects:
                    return None
            if calls != references:
                return None
        if predicate:
            return first if len(subjects) == 1 else None
        return subjects.pop() if len(subjects) == 1 else None

    def _sites_in_piece(self, info, piece, name, fn, param, position, predicate):
        """[(subject or GPU-test text, tree or None)] for each call of ``name`` in the piece; None
        when one passes nothing for ``param``."""
        tree = piece.tree
        out = []
        for func in [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            own = [n for n in walk_no_nested(func.body) if isinstance(n, ast.Call) and last_name(n.func) == name]
            if not own:
                continue
            local = {}
            scope = Scope(self, info, None, None, local)
            if func is not tree:
                params = params_of(func)
                # The caller's own parameter may carry it on (proven the same way, cached).
                scope.fn = FunctionContext(func.name, None, {}, local, params, (),
                                           first_is_self=bool(params) and params[0] in ("self", "cls"))
                collect_local_cc(func, scope, local)
                scope.param_flow = True
            for call in own:
                shift = 1 if fn.first_is_self and isinstance(call.func, ast.Attribute) else 0
                arg = None
                for kw in call.keywords:
                    if kw.arg == param:
                        arg = kw.value
                if arg is None and 0 <= position - shift < len(call.args):
                    if any(isinstance(a, ast.Starred) for a in call.args[:position - shift + 1]):
                        return None
                    arg = call.args[position - shift]
                if arg is None:
                    return None  # the default is used: not a capability
                if predicate:
                    # The same pure GPU test at every call site (`is_blackwell=current_platform.is_blackwell()`).
                    scope.locator = Locator(info.source, piece)
                    argtree = build(arg, scope) if interesting(arg, scope) else None
                    if argtree is None or not only_atoms(argtree) or not is_gate_tree(argtree):
                        return None
                    out.append((" ".join(scope.locator.text(arg).split()), argtree))
                else:
                    out.append((cc_subject(arg, scope), None))
        return out

    def statements_naming(self, info, name):
        """The pieces (top-level statements, or members of a long class) of ``info`` whose text holds
        ``name`` (cached): all its references live there. Raises SyntaxError when one does not
        parse on its own."""
        key = (info.rel, name)
        if key not in self._trees:
            lines = info.source.lines
            pieces = []
            for begin, end in module_ranges(info.source):
                chunk = "".join(lines[begin:end])
                if name not in chunk:
                    continue
                members = None
                if end - begin > 150 and re.search(r"^class\s", chunk, re.M):
                    members = split_class(info.source, begin, end, [name], set())
                if members is None:
                    pieces.append(Piece(begin, 0, parse_chunk(info.source, begin, 0, chunk), "", False))
                else:
                    pieces.extend(members)  # the members naming it (or a token); others cannot call it
            self._trees[key] = pieces
        return self._trees[key]

    def site_info(self, rel):
        """``rel`` as another file's analysis (call sites, constants) may see it: as loaded, before
        its own walk, whichever worker holds it and whether or not it was walked already, so that
        the result depends neither on how files are shared among workers nor on walk order.
        Files the scan does not load are read bare, as before. None when not UTF-8."""
        info = self.files.get(rel)
        if info is not None and rel not in self._walked:
            return info
        if rel not in self._site_infos:
            found = None
            try:
                found = FileInfo(FileSource(rel, self.texts[rel].decode("utf-8"), self._text_memo))
            except UnicodeDecodeError:
                found = None
            if found is not None and self.select([rel]):
                loaded = FileInfo(FileSource(rel, found.source.text, self._text_memo))
                load_info(loaded, ())
                extra = [n for n in self.extra_names() if n.encode() in self.texts[rel]]
                if extra and not loaded.error:
                    load_info(loaded, extra)
                if not loaded.error:
                    found = loaded  # an unparseable file is not loaded by the scan: read it bare
            self._site_infos[rel] = found
        return self._site_infos[rel]
