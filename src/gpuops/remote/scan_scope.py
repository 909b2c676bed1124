"""Gate scan, condition tree: what a name means where a condition is read (``Scope``: the file, the
function's local aliases and capability values) and the function being read (``FunctionContext``).
Host code: stdlib only, Python 3.8+."""

from gpuops.remote.scan_discovery import module_files
from gpuops.remote.scan_vocabulary import TOKENS


class Scope(object):
    """What names mean where a condition is read: the file, plus a function's local aliases."""

    def __init__(self, scanner, info, locator, local_aliases=None, cc_vars=None, fn=None):
        self.scanner = scanner
        self.info = info
        self.locator = locator
        self.local_aliases = {} if local_aliases is None else local_aliases
        self.cc_vars = {} if cc_vars is None else cc_vars
        self.fn = fn            # the FunctionContext read in (its parameters and local names)
        self.param_flow = False  # set while reading a comparison with a capability-like literal
        self.nested = []        # boolean roots found inside opaque clauses
        self.requires = []      # capability tests the statement needs to get past (table lookups)
        self.expanding = set()  # alias names being expanded (cycles)

    def shadowed(self, name):
        """A parameter or local of the function, which is not what the module's name means."""
        fn = self.fn
        return fn is not None and name in fn.shadow and name not in self.local_aliases and name not in self.cc_vars

    def imported(self, name, table):
        """What ``name``, imported from another module of the tree, is in that module's ``table``
        ("vars" or "funcs"), or None."""
        if self.scanner is None or name not in self.info.imports:
            return None
        module, original = self.info.imports[name]
        for rel in module_files(module):
            entry = self.scanner.cc_tables.get(rel)
            if entry and original in entry[table]:
                return entry[table][original]
        return None


class FunctionContext(object):
    def __init__(self, qual, doc, local_aliases, cc_vars, params=(), assigned=(), first_is_self=False):
        self.qual = qual
        self.doc = doc
        self.local_aliases = local_aliases
        self.cc_vars = cc_vars
        self.params = list(params)
        self.first_is_self = first_is_self
        self.values = {}  # name -> value node of a local assigned once (set by the walker)
        self.math_switches = {}  # name -> the compiler math mode it picks (scan_walker.math_mode_switches)
        # A class's methods another of its methods reads negated (`not cls.X()`): X -> that method's name
        # (scan_effects.negated_methods); a method's own entry, if any, is ``alternative``.
        self.negated_by = {}
        self.alternative = None
        # Names that mean something local here, never the module's predicate of that name.
        self.shadow = set(params) | set(assigned)
        names = list(local_aliases) + [n for n, v in cc_vars.items() if v]
        self.words = [w for w in names if not any(t in w for t in TOKENS)]

    def mentions(self, source, first, last):
        text = "".join(source.lines[first - 1:last])
        return any(w in text for w in self.words)
