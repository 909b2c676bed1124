"""Bundle a host helper with the host modules it imports, into one script for one exec.

Host code is stdlib-only Python 3.8+ and is never installed on a host: it travels on stdin (or in
a heredoc, or as a file torchrun runs) as one script. To let that code live in small modules, as
Ansible's ``module_common.recursive_finder`` does for its modules, the bundler finds every module of
``gpuops.remote`` that the entry module imports (directly or through another one, at module level or
inside a function), and prepends ONE line to the entry's text that registers their sources with an
in-memory import finder. The entry then imports them with ordinary absolute imports
(``from gpuops.remote import fileops``), which work the same on the client (where the package is
installed) and on the host (where the bundle serves them): one copy of each helper for both sides.

The added line goes after the entry's docstring and ``from __future__`` imports (which must come
first), so tracebacks on the host are off by exactly one line below it. An entry that imports no
sibling module is sent unchanged.
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path

from gpuops.shipping import bundle_cache
from gpuops.frozen import frozen
from gpuops import python_ast

ROOT_PACKAGE = "gpuops.remote"

# Runs on the host, first thing in the helper: serve the bundled modules (and the empty
# ``gpuops`` / ``gpuops.remote`` packages above them) from memory, ahead of anything installed
# there, so the host runs exactly the code this client sent.
#
# Compiling those modules is a large share of a helper's own CPU on the host: the apply helper's 27
# modules (216 KB) took ~25 ms to compile and 1.4 ms to load from marshal (Debian's python3.11, loaded
# machine); a lab apply's helper process took 53.7 ms of CPU, 42.5 ms with them kept. Given a directory in
# ``GPUOPS_BYTECODE`` (``shipping.python_command(bytecode_dir=)``: the apply transaction's helper, in
# gpuops' state dir on the host, while the client keeps results) the code objects are kept there as
# Python keeps .pyc files: one file per module named by the sha256 of the python's bytecode tag, the
# module's name and its source, used only when its header names that digest. The directory is made
# only inside a parent that exists and is the helper's user's own (the state dir: never created here,
# so a command refused on a host gpuops never changed leaves nothing), and used only when that user
# owns it and nobody else may write there, checked on the open descriptor every later open goes
# through (a path swapped meanwhile is never followed); anything amiss and the module is compiled as
# before. Read-only commands (the gather, the gate scanner) are never given a directory.
#
# The finder is a plain object: the import system asks only for ``find_spec`` and ``exec_module``
# (PEP 451), and ``importlib.abc`` (its ABCs) imports importlib.resources, pathlib and re: ~10 ms of
# every helper's start on the host (Debian's python3.11 -S), where the whole check of a kept gate
# scan takes ~35 ms. ``importlib.util`` (~3 ms) only when a bytecode directory is given.
_BOOTSTRAP = '''
import importlib.machinery, os, sys
class GpuopsBytecode(object):
    MAX_ENTRIES = 512
    def __init__(self):
        self.fd = None
        tag = getattr(sys.implementation, "cache_tag", None)
        path = os.environ.get("GPUOPS_BYTECODE") or ""
        if tag is None or not os.path.isabs(path):
            return
        import importlib.util
        self.tag = ("%s %s %d" % (tag, importlib.util.MAGIC_NUMBER.hex(), sys.flags.optimize)).encode()
        try:
            if os.stat(os.path.dirname(path)).st_uid != os.geteuid():
                return
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            info = os.fstat(fd)
            if info.st_uid != os.geteuid() or info.st_mode & 0o077:
                os.close(fd)
                return
            self.fd = fd
        except (OSError, ValueError):
            return
    def code(self, name, source, filename):
        if self.fd is None:
            return compile(source, filename, "exec")
        import hashlib, marshal
        digest = hashlib.sha256(self.tag + b"\\0" + name.encode() + b"\\0" + source.encode("utf-8")).digest()
        entry = digest.hex()[:48]
        try:
            with os.fdopen(os.open(entry, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.fd), "rb") as handle:
                data = handle.read()
            if data[:32] == digest:
                return marshal.loads(data[32:])
        except (OSError, ValueError, EOFError, TypeError):
            pass
        code = compile(source, filename, "exec")
        self.keep(entry, digest + marshal.dumps(code))
        return code
    def keep(self, entry, data):
        tmp = "%s.%d.tmp" % (entry, os.getpid())
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                                   dir_fd=self.fd), "wb") as handle:
                handle.write(data)
            os.replace(tmp, entry, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            names = os.listdir(self.fd)
            if len(names) > self.MAX_ENTRIES:
                ages = sorted((os.stat(n, dir_fd=self.fd, follow_symlinks=False).st_mtime, n) for n in names)
                for _, name in ages[:len(names) - self.MAX_ENTRIES // 2]:
                    os.unlink(name, dir_fd=self.fd)
        except OSError:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass
class GpuopsBundleFinder(object):
    def __init__(self, sources, packages):
        self.sources, self.packages, self.bytecode = sources, packages, GpuopsBytecode()
    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.sources or fullname in self.packages:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname in self.packages)
        return None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        name = module.__name__
        if name in self.packages:
            return
        module.__file__ = "<gpuops-bundle:%s>" % name
        exec(self.bytecode.code(name, self.sources[name], module.__file__), module.__dict__)
sys.meta_path.insert(0, GpuopsBundleFinder(SOURCES, PACKAGES))
'''


class BundleError(ValueError):
    """A host module imports something the bundle cannot carry (a client-only gpuops module)."""


@frozen
class Bundle:
    """The entry module and, in dependency discovery order, the host modules it needs."""

    entry: str
    modules: dict[str, str]  # dotted name -> source text (the entry not included)

    def script(self, entry_text: str) -> str:
        if not self.modules:
            return entry_text
        packages = sorted(_parent_packages(self.modules))
        line = "exec(compile(%r, '<gpuops-bundle>', 'exec'), {'SOURCES': %r, 'PACKAGES': %r})\n" % (
            _BOOTSTRAP, self.modules, packages)
        lines = entry_text.splitlines(keepends=True)
        at = _insertion_line(entry_text)
        return "".join(lines[:at]) + line + "".join(lines[at:])


def module_path(name: str, search_dir: Path) -> Path | None:
    """The file of host module ``gpuops.remote.<name>`` (or a dotted submodule), if it exists."""
    relative = name[len(ROOT_PACKAGE) + 1:].replace(".", "/")
    path = search_dir / f"{relative}.py"
    return path if path.is_file() else None


def imported_host_modules(text: str, search_dir: Path, where: str) -> list[str]:
    """Dotted names of the ``gpuops.remote`` modules that ``text`` imports, in source order."""
    found: list[str] = []
    for node in ast.walk(python_ast.parse(text, filename=where)):
        candidates: list[str] = []
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise BundleError(f"{where}: relative import at line {node.lineno}: host modules use "
                                  f"absolute imports (from {ROOT_PACKAGE} import ...)")
            base = node.module or ""
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for name in candidates:
            if name == "gpuops" or (name.startswith("gpuops.") and not _under_root(name)):
                raise BundleError(f"{where}: imports {name} (line {getattr(node, 'lineno', '?')}), which does not run on "
                                  f"hosts: host code may import only the standard library and {ROOT_PACKAGE}")
            if _under_root(name) and name != ROOT_PACKAGE and module_path(name, search_dir):
                if name not in found:
                    found.append(name)
    return found


def find_bundle(entry: str, search_dir: Path) -> Bundle:
    """Every host module ``entry`` (a name in ``search_dir``) needs, found recursively."""
    entry_name = f"{ROOT_PACKAGE}.{entry}"
    modules: dict[str, str] = {}
    pending = [entry_name]
    seen = {entry_name}
    while pending:
        name = pending.pop(0)
        path = module_path(name, search_dir)
        if path is None:
            raise BundleError(f"host module {name} not found in {search_dir}")
        text = path.read_text(encoding="utf-8")
        if name != entry_name:
            modules[name] = text
        for dep in imported_host_modules(text, search_dir, str(path)):
            if dep not in seen:
                seen.add(dep)
                pending.append(dep)
    return Bundle(entry=entry_name, modules=modules)


def bundled_source(entry: str, search_dir: Path, cached: bool = False) -> str:
    """The entry's text with its host modules bundled in (unchanged when it imports none).

    Finding the modules parses each with ``ast`` (a large share of a command's local time for the
    gate scanner), so with ``cached`` the result is kept by the memo layer with the size and mtime
    of every file it came from, this bundler included, and is used again only while all of them are
    unchanged (``bundle_cache.py``).
    """
    key = bundle_cache.bundle_key(entry, search_dir) if cached else None
    hit = bundle_cache.read(key) if key is not None else None
    if hit is not None:
        return hit
    # One bundling at a time: hosts' threads (two nodes of a deployment, first run after an upgrade)
    # parsing at once made CPython 3.11's ast raise "AST constructor recursion depth mismatch".
    with _BUILDING:
        hit = bundle_cache.read(key) if key is not None else None
        if hit is not None:
            return hit
        path = search_dir / f"{entry}.py"
        bundle = find_bundle(entry, search_dir)
        script = bundle.script(path.read_text(encoding="utf-8"))
        if key is not None:
            files = [path, Path(__file__)] + [module_path(name, search_dir) for name in bundle.modules]
            bundle_cache.write(key, script, [f for f in files if f is not None])
    return script


_BUILDING = threading.Lock()


def _under_root(name: str) -> bool:
    return name == ROOT_PACKAGE or name.startswith(ROOT_PACKAGE + ".")


def _parent_packages(modules: dict[str, str]) -> set[str]:
    packages = set()
    for name in modules:
        parts = name.split(".")
        for i in range(1, len(parts)):
            packages.add(".".join(parts[:i]))
    return packages


def _insertion_line(text: str) -> int:
    """Index of the first line after the module docstring and ``from __future__`` imports."""
    body = python_ast.parse_module(text).body
    at = 0
    for i, node in enumerate(body):
        is_docstring = (i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                        and isinstance(node.value.value, str))
        is_future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if not (is_docstring or is_future):
            break
        at = node.end_lineno or node.lineno
    return at
