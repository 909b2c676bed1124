"""Runs ON THE HOST with the chosen python ($GPUOPS_PY): stdlib only, Python 3.8+.

Reports the interpreter and the versions and install paths of the packages SGLang's performance
depends on, from package metadata and files read as text. It never imports torch, sglang or
flashinfer: importing torch takes seconds and initialises CUDA, and a broken install must still be
reported, not crash the probe. Prints one JSON object on stdout.
"""

import fcntl
import glob
import json
import os
import platform
import re
import stat
import struct
import sys

# distribution name -> top-level import name (to find where it is installed without importing it)
PACKAGES = (
    ("sglang", "sglang"),
    ("flashinfer-python", "flashinfer"),
    ("sgl-kernel", "sgl_kernel"),
    ("sglang-kernel", None),  # sgl-kernel's later name; same import name, so metadata only
    ("flashinfer-cubin", "flashinfer_cubin"),  # FlashInfer's prebuilt cubins (AOT)
    ("flashinfer-jit-cache", "flashinfer_jit_cache"),  # FlashInfer's prebuilt JIT modules
    ("sgl-deep-gemm", "deep_gemm"),  # DeepGEMM: SGLang uses it only where `import deep_gemm` works
    ("torch", "torch"),
    ("nvidia-nccl-cu13", None),
    ("nvidia-nccl-cu12", None),
)

NCCL_HEADERS = ("/usr/include/nccl.h", "/usr/local/cuda/include/nccl.h", "/usr/local/include/nccl.h")
NCCL_LIB_GLOBS = (
    "/usr/lib/x86_64-linux-gnu/libnccl.so.*",
    "/usr/lib/aarch64-linux-gnu/libnccl.so.*",
    "/usr/lib64/libnccl.so.*",
    "/usr/local/cuda/lib64/libnccl.so.*",
    "/usr/local/lib/libnccl.so.*",
)


class Unreadable(OSError):
    """A file that is there but is not read: not a regular file, or over the read's limit."""


def open_regular(path):
    """The regular file at ``path`` (links followed), opened for reading in binary; ``Unreadable``
    for anything else. A package tree can hold anything under a file's name: a FIFO (an open
    blocks for good), a link to /dev/zero (a read never ends). So the open does not block, and the
    check that counts is on the open descriptor (a name can be swapped between a check and the
    open); the one by name before it only keeps a device from being opened at all (opening some
    has effects). The scanner's reader is the same (remote/scan_read.py; this probe is sent as
    one script, without the bundled modules)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise Unreadable("not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Unreadable("not a regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)  # reads as usual from here
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_limited(path, limit):
    """The text of the regular file at ``path``; ``Unreadable`` when it holds more than ``limit``
    bytes (a cut text would be read wrong), OSError when it is missing or cannot be read."""
    with open_regular(path) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise Unreadable("larger than %d bytes" % limit)
    return data.decode("utf-8", "replace")


def read_text(path, limit=1 << 20):
    """The first ``limit`` bytes of a regular file, as text (a version near its top); None when
    it cannot be read."""
    try:
        with open_regular(path) as handle:
            return handle.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def package_dir(import_name):
    """Where a top-level package lives, found the way `import` would, without running it."""
    try:
        import importlib.util

        spec = importlib.util.find_spec(import_name)
    except Exception:
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return locations[0]
    return os.path.dirname(spec.origin) if spec.origin else None


def version_from_file(directory, import_name):
    # A source checkout or an unpacked tree may lack metadata; SGLang keeps `__version__` in version.py.
    for name in ("version.py", "_version.py", "__init__.py"):
        text = read_text(os.path.join(directory, name))
        if text:
            match = re.search(r"^__version__\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
            if match:
                return match.group(1)
    return None


# The requirements of the installed SGLang worth checking against what is installed.
PINNED = ("flashinfer-python", "flashinfer_python", "sgl-kernel", "sglang-kernel", "torch")


def pinned_requirements(dist):
    """SGLang's own Requires-Dist lines for the stack packages (without extras-only ones)."""
    out = []
    for line in dist.requires or []:
        name = re.split(r"[\s\[<>=!~;(]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
        if name.replace("-", "_") in [p.replace("-", "_") for p in PINNED] and "extra ==" not in line:
            out.append(line.strip())
    return out


def metadata_readable(dist):
    """Whether the files importlib.metadata reads of ``dist`` (with a plain open, no bound) are
    regular files of a sane size: a FIFO named METADATA would block it for good. Checked just
    before it reads them (a swap in between is not guarded against)."""
    where = getattr(dist, "_path", None)  # PathDistribution's directory (3.8 to 3.13)
    if where is None:
        return True
    for name in ("METADATA", "PKG-INFO", "requires.txt"):
        path = os.path.join(str(where), name)
        if os.path.lexists(path):
            try:
                with open_regular(path) as handle:
                    if os.fstat(handle.fileno()).st_size > 4 << 20:  # a real one: ~30 KB (SGLang 0.5.8 to 0.5.23)
                        return False
            except OSError:
                return False
    return True


def distribution_info(dist_name, import_name):
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        metadata = None
    version = None
    source = None
    location = None
    requires = None
    if metadata is not None:
        try:
            dist = metadata.distribution(dist_name)
            if not metadata_readable(dist):
                raise Unreadable("metadata")  # the version is read from the package's files instead
            version = dist.version
            source = "metadata"
            location = str(dist.locate_file(""))
            if dist_name == "sglang":
                requires = pinned_requirements(dist)
        except Exception:
            pass
    path = package_dir(import_name) if import_name else None
    if version is None and path:
        version = version_from_file(path, import_name)
        source = "version.py" if version else None
    if version is None and path is None:
        return None
    info = {"version": version, "path": path, "location": location, "source": source}
    if requires is not None:
        info["requires"] = requires
    return info


def torch_cuda(torch_dir):
    """torch.version.cuda, read from torch/version.py as text (never import torch)."""
    text = read_text(os.path.join(torch_dir, "version.py")) if torch_dir else None
    if not text:
        return None
    match = re.search(r"^cuda\s*(?::[^=]*)?=\s*(?:['\"]([^'\"]*)['\"]|None)", text, re.M)
    return match.group(1) if match and match.group(1) else None


def nccl_info(packages):
    for dist_name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        info = packages.get(dist_name)
        if info and info.get("version"):
            return {"version": info["version"], "source": dist_name, "path": info.get("location")}
    for header in NCCL_HEADERS:
        text = read_text(header)
        if text:
            parts = [re.search(r"#define\s+NCCL_%s\s+(\d+)" % key, text) for key in ("MAJOR", "MINOR", "PATCH")]
            if all(parts):
                return {"version": ".".join(p.group(1) for p in parts), "source": "header", "path": header}
    for pattern in NCCL_LIB_GLOBS:
        for path in sorted(glob.glob(pattern)):
            match = re.search(r"libnccl\.so\.(\d+\.\d+\.\d+)$", path)
            if match:
                return {"version": match.group(1), "source": "library", "path": path}
    return None


def search_path():
    """sys.path, and the user site dir when it is enabled but absent (a `pip install --user` creates
    it and then shadows the site dirs): the directories a package install changes (apply/kept_facts.py)."""
    path = [p for p in sys.path if p]
    try:
        import site

        user = site.USER_SITE if site.ENABLE_USER_SITE else None
    except Exception:  # -S, or an embedded python without site
        user = None
    if user and user not in path:
        path.append(user)
    return path


# --- What the kernel libraries themselves admit (gates/kernels.py judges it) -----------------------
# The client names what to read (the catalog's `kernels:` needs, as the probe's argv JSON):
#   {"flashinfer": {"jit/comm.py": {"generators": true}, "comm/__init__.py": {"symbols": [NAME]}},
#    "sglang": {"srt/.../pcie_ipc_ar.py": {"anchors": [REGEX]}}}
# and gets, per package and file: exists, the file's generators (`def gen_*` with the
# `supported_major_versions=[...]` literal the JIT spec builds for, and its line), the lines
# defining or importing each symbol, the first line matching each anchor (and its text), the int
# keys of each named top-level dict literal (`dicts`). Read as text and with
# `ast`, never imported.

MAX_READ_FILES = 32


def _generators(tree):
    """{function: [def_line, majors or None (no restriction) or "unknown", majors_line]}."""
    import ast

    out = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        majors, line = None, None
        for sub in ast.walk(node):
            if isinstance(sub, ast.keyword) and sub.arg == "supported_major_versions":
                value = sub.value
                line = getattr(value, "lineno", node.lineno)
                if isinstance(value, (ast.List, ast.Tuple)) and all(
                        isinstance(e, ast.Constant) and isinstance(e.value, int) for e in value.elts):
                    majors = sorted(e.value for e in value.elts)
                else:
                    majors = "unknown"  # a variable: what it holds is not read here
                break
        out[node.name] = [node.lineno, majors, line]
    return out


def _dict_keys(tree, names):
    """{NAME: [line, sorted int keys] or None} for top-level ``NAME = {9: ..., 10: ...}``."""
    import ast

    out = {str(n): None for n in names}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in out:
                    keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, int)]
                    out[target.id] = [node.lineno, sorted(keys)]
    return out


def _symbol_lines(text, names):
    out = {}
    for name in names:
        match = re.search(r"(?m)^.*\b%s\b" % re.escape(str(name)), text)
        out[str(name)] = text.count("\n", 0, match.start()) + 1 if match else None
    return out


def _anchor_lines(text, patterns):
    out = {}
    for pattern in patterns:
        try:
            match = re.search(str(pattern), text, re.M)
        except re.error:
            match = None
        if match:
            line = text.count("\n", 0, match.start()) + 1
            out[str(pattern)] = [line, text.splitlines()[line - 1].strip()[:200]]
        else:
            out[str(pattern)] = None
    return out


def read_package_files(root, wanted):
    files = {}
    for rel, what in sorted(wanted.items())[:MAX_READ_FILES]:
        rel = str(rel)
        if rel.startswith("/") or ".." in rel.split("/") or not isinstance(what, dict):
            continue
        try:
            text = read_limited(os.path.join(root, rel), 16 << 20)  # as remote/scan_read.FILE_BYTES_MAX
        except FileNotFoundError:
            text = None
        except OSError as exc:  # there, but not read: what it holds cannot be told
            files[rel] = {"exists": True, "error": "cannot be read: %s" % (exc.strerror or exc)}
            continue
        entry = {"exists": text is not None}
        if text is not None:
            if what.get("generators") or what.get("dicts"):
                try:
                    import ast

                    tree = ast.parse(text)
                    if what.get("generators"):
                        entry["generators"] = _generators(tree)
                    if what.get("dicts"):
                        entry["dicts"] = _dict_keys(tree, what["dicts"])
                except (SyntaxError, ValueError) as exc:
                    entry["error"] = "does not parse: %s" % exc
            if what.get("symbols"):
                entry["symbols"] = _symbol_lines(text, what["symbols"])
            if what.get("anchors"):
                entry["anchors"] = _anchor_lines(text, what["anchors"])
        files[rel] = entry
    return files


def nvcc_info():
    """The host's nvcc (PATH, then /usr/local/cuda/bin) and the CUDA release it compiles for."""
    import shutil
    import subprocess

    path = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.access("/usr/local/cuda/bin/nvcc", os.X_OK) else None)
    if path is None:
        return None
    try:
        done = subprocess.run([path, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
        text = done.stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        return {"path": path, "version": None}
    match = re.search(r"release (\d+\.\d+)", text)
    return {"path": path, "version": match.group(1) if match else None}


FATBIN_MAGIC = 0xBA55ED50
MAX_EXTENSION_FILES = 8
MAX_FATBIN_STEPS = 200000


def elf_section(f, name):
    """(offset, size) of section ``name`` (bytes) of a 64-bit little-endian ELF file, else None."""
    f.seek(0)
    head = f.read(64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    shoff = struct.unpack_from("<Q", head, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    if shentsize < 64 or not 0 < shnum <= 65535 or shstrndx >= shnum or shentsize * shnum > 64 * 65535:
        return None  # ELF64's section headers are 64 bytes: a table over 4 MiB is no real file's
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    if len(table) < shentsize * shnum:
        return None

    def header(i):  # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size
        return struct.unpack_from("<IIQQQQ", table, i * shentsize)

    strtab = header(shstrndx)
    f.seek(strtab[4])
    names = f.read(min(strtab[5], 1 << 20))
    for i in range(shnum):
        entry = header(i)
        start = entry[0]
        if names[start:names.find(b"\0", start)] == name:
            return entry[4], entry[5]
    return None


def fatbin_arches(path):
    """The GPU architectures a CUDA extension carries device code for, from its ``.nv_fatbin``
    section (what cuobjdump lists): ``{"sass": [90, 100, 120], "ptx": [...]}`` (sm_XY as XY), None
    when the file has no such section. Only the entries' headers are read (by seeking), so a
    file of hundreds of MB costs a few thousand small reads. The layout: fatbin headers (magic
    0xBA55ED50, u16 version, u16 header size, u64 size of its entries), each followed by entries
    whose header holds the kind (u16 at 0: 1 PTX, 2 ELF/SASS), its own size (u32 at 4), the
    payload's size (u64 at 8) and the architecture (u32 at 28)."""
    sass, ptx = set(), set()
    with open_regular(path) as f:
        found = elf_section(f, b".nv_fatbin")
        if found is None:
            return None
        pos, end = found[0], found[0] + found[1]
        steps = 0
        while pos + 16 <= end and steps < MAX_FATBIN_STEPS:
            steps += 1
            f.seek(pos)
            magic, _, header_size, size = struct.unpack("<IHHQ", f.read(16))
            if magic != FATBIN_MAGIC:
                pos += 8  # fatbins sit 8-byte aligned in the section
                continue
            entry, stop = pos + header_size, min(pos + header_size + size, end)
            while entry + 32 <= stop and steps < MAX_FATBIN_STEPS:
                steps += 1
                f.seek(entry)
                raw = f.read(32)
                kind, _, entry_size, payload = struct.unpack_from("<HHIQ", raw, 0)
                arch = struct.unpack_from("<I", raw, 28)[0]
                if kind == 1:
                    ptx.add(arch)
                elif kind == 2:
                    sass.add(arch)
                if entry_size == 0:
                    break
                entry += entry_size + payload
            pos = max(stop, pos + 16)
    return {"sass": sorted(sass), "ptx": sorted(ptx)}


def read_extensions(root, wanted):
    """For each wanted extension name (``common_ops``): the compiled files of that name in the
    package and one directory down (sgl-kernel ships ``sm90/`` and ``sm100/`` builds and loads
    one by the GPU), each with the architectures its device code is built for."""
    out = {}
    for name, what in sorted(wanted.items())[:MAX_READ_FILES]:
        name = str(name)
        if not isinstance(what, dict) or not what.get("arches") or not re.match(r"^[A-Za-z0-9_]+$", name):
            continue
        paths = sorted(glob.glob(os.path.join(root, name + "*.so")) + glob.glob(os.path.join(root, "*", name + "*.so")))
        arches = {}
        for path in paths[:MAX_EXTENSION_FILES]:
            rel = os.path.relpath(path, root)
            try:
                found = fatbin_arches(path)
                arches[rel] = found if found is not None else {"error": "no .nv_fatbin section (no device code)"}
            except (OSError, ValueError, struct.error) as exc:
                arches[rel] = {"error": "cannot read: %s" % exc}
        out[name] = {"exists": bool(paths), "arches": arches}
    return out


def kernel_reads(wanted, packages):
    out = {}
    for key, dist in (("flashinfer", "flashinfer-python"), ("sglang", "sglang"), ("deep_gemm", "sgl-deep-gemm")):
        info = packages.get(dist)
        root = info.get("path") if info else None
        if not root or not isinstance(wanted.get(key), dict):
            continue
        out[key] = {"root": root, "files": read_package_files(root, wanted[key])}
    # sgl-kernel and its later name sglang-kernel share the import name sgl_kernel.
    kernel = packages.get("sgl-kernel") or packages.get("sglang-kernel")
    root = (kernel.get("path") if kernel else None) or (package_dir("sgl_kernel") if kernel else None)
    if root and isinstance(wanted.get("sgl_kernel"), dict):
        out["sgl_kernel"] = {"root": root, "files": read_extensions(root, wanted["sgl_kernel"])}
    fi = packages.get("flashinfer-python")
    if fi and fi.get("path"):
        aot = os.path.join(fi["path"], "data", "aot")
        try:
            out.setdefault("flashinfer", {"root": fi["path"], "files": {}})["aot"] = sorted(os.listdir(aot))[:400]
        except OSError:
            out.setdefault("flashinfer", {"root": fi["path"], "files": {}})["aot"] = None
    out["nvcc"] = nvcc_info()
    return out


def main():
    # `python -c` puts "" (the directory the probe happens to run in: the login directory) first on
    # sys.path; the server never sees that directory, and the kept facts' fingerprint does not cover it.
    while "" in sys.path:
        sys.path.remove("")
    packages = {}
    for dist_name, import_name in PACKAGES:
        packages[dist_name] = distribution_info(dist_name, import_name)
    torch = packages.get("torch")
    if torch is not None:
        torch["cuda"] = torch_cuda(torch.get("path"))
        # The wheel's metadata (what pip shows) may say "2.11.0" where torch.__version__ (in
        # version.py) says "2.11.0+cu130": keep both.
        torch["version_full"] = version_from_file(torch["path"], "torch") if torch.get("path") else None
    result = {
        "python": {
            "executable": sys.executable,
            "version": "%d.%d.%d" % tuple(sys.version_info[:3]),
            "implementation": platform.python_implementation(),
            "prefix": sys.prefix,
            "path": search_path(),
        },
        "packages": packages,
        "nccl": nccl_info(packages),
    }
    wanted = {}
    if len(sys.argv) > 1:
        try:
            wanted = json.loads(sys.argv[1])
        except ValueError:
            wanted = {}
    if isinstance(wanted, dict) and wanted:
        result["kernels"] = kernel_reads(wanted, packages)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
