"""Gate scan, stage 1: the options, the ``sglang`` package to scan (found, never imported), its
version, its Python files, and how a module name maps to them. Host code: stdlib only, Python 3.8+."""

import json
import os
import re
import sys

from gpuops.remote.scan_read import FILE_BYTES_MAX, NotRead, read_regular

SKIP_DIRS = ("__pycache__", "test", "tests")


def read_options(argv):
    if len(argv) > 1 and argv[1].strip():
        try:
            opts = json.loads(argv[1])
        except ValueError:
            return None, "options are not JSON"
        if not isinstance(opts, dict):
            return None, "options are not a JSON object"
        return opts, None
    return {}, None


def find_sglang(opts):
    root = opts.get("root")
    if root:
        root = os.path.abspath(root)
        if not os.path.isfile(os.path.join(root, "__init__.py")):
            return None, "no sglang package at %s" % root
        return root, None
    try:
        import importlib.util

        spec = importlib.util.find_spec("sglang")  # finds without importing it
    except Exception as exc:  # a broken sys.path entry must not crash the probe
        return None, "cannot look for sglang: %s" % exc
    if spec is None or not spec.submodule_search_locations:
        return None, "sglang is not installed for %s" % sys.executable
    for location in spec.submodule_search_locations:
        if os.path.isfile(os.path.join(location, "__init__.py")):
            return os.path.abspath(location), None
    return None, "sglang at %s is not a regular package" % list(spec.submodule_search_locations)


def find_version(root):
    """The release's version, from its distribution's metadata, else its ``version.py`` (both read
    as the scan reads a file: regular files only, bounded; ``scan_read``)."""
    site = os.path.dirname(root)
    try:
        names = sorted(os.listdir(site))
    except OSError:
        names = []
    for name in names:
        low = name.lower()
        if low.startswith("sglang-") and (low.endswith(".dist-info") or low.endswith(".egg-info")):
            meta = os.path.join(site, name, "METADATA" if low.endswith(".dist-info") else "PKG-INFO")
            try:
                text = read_regular(meta, FILE_BYTES_MAX).decode("utf-8", "replace")
            except NotRead:
                continue
            for line in text.splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():
                    break
    try:
        text = read_regular(os.path.join(root, "version.py"), FILE_BYTES_MAX).decode("utf-8", "replace")
    except NotRead:
        return None
    match = re.search(r"__version__\s*=\s*[\"']([^\"']+)", text)
    return match.group(1) if match else None


def walk_python_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        # relpath once a directory, not once a file (~4,000 files: it normalises both paths each time)
        under = os.path.relpath(dirpath, root).replace(os.sep, "/")
        prefix = "" if under == "." else under + "/"
        for name in sorted(filenames):
            if name.endswith(".py") and not name.startswith("test_") and name != "conftest.py":
                yield prefix + name, os.path.join(dirpath, name)


def module_files(module):
    parts = module.split(".")
    if not parts or parts[0] != "sglang":
        return []
    rel = "/".join(parts[1:])
    if not rel:
        return ["__init__.py"]
    return [rel + ".py", rel + "/__init__.py"]


def default_jobs():
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))
