"""The feature catalog (``catalog.yaml``): which gates lie on a feature's path, recognised by what
the code does. Loading checks the file's shape; matching is pure."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import field
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpuops.errors import GpuopsError
from gpuops.gates import BUILTIN_CATALOG
from gpuops.yamlfile import parse_yaml_text
from gpuops.frozen import frozen

ROLES = ("runtime", "auto_enable", "hardware")
_MATCH_KEYS = ("context", "sets", "reads", "message", "function", "kind")
DEFAULTS = ("on", "auto", "off")


@frozen
class GateRule:
    """One rule of a feature's ``gates:`` list (tried in order, the first that matches wins): a gate that matches
    every key the rule gives (``context``, ``sets``, ``reads``, ``message``, ``function``, ``kind``) has its
    ``role`` on the feature's path, for the reason ``why``."""

    role: str
    why: str
    scope: str | None = None  # "runtime_files": only in files holding a runtime gate of the feature
    context: tuple[re.Pattern[str], ...] = ()
    sets: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    message: re.Pattern[str] | None = None
    function: tuple[str, ...] = ()
    kind: tuple[str, ...] = ()  # the gate's kind (if, guard, assert, return, assign, expr)
    path: str | None = None  # which of the feature's kernel paths the gate is on ("CUTLASS FP8 MoE runner")

    def matches(self, gate: Mapping[str, Any]) -> bool:
        effect = gate.get("effect") or {}
        if self.context:
            text = gate_context(gate)
            if not any(p.search(text) for p in self.context):
                return False
        if self.sets and not set(self.sets) & set(effect.get("sets") or ()):
            return False
        if self.reads and not set(self.reads) & set(gate.get("reads") or ()):
            return False
        if self.message is not None and not self.message.search(str(effect.get("message") or "")):
            return False
        if self.function and str(gate.get("function", "")).split(".")[-1] not in self.function:
            return False
        if self.kind and str(gate.get("kind")) not in self.kind:
            return False
        return True


@frozen
class FlagChoice:
    """A launch flag that turns a feature on (``flags:`` in the catalog), by the setting the release's gates
    test; a feature's first flag whose setting the release reads or sets is the one used."""

    setting: str
    flag: str
    values: tuple[str, ...] = ()
    selects: bool = False   # on only with one of ``values`` (--attention-backend fa3)
    inverse: bool = False   # a switch that turns the feature off (--disable-...)


@frozen
class KernelNeed:
    """What a feature needs of the library that runs its kernel (``kernels:`` in the catalog):
    a FlashInfer JIT generator that builds for the GPU's major (``generator``), a name FlashInfer
    exports (``symbol``), a module of the SGLang release (``module``), or a compiled extension of
    sgl-kernel / sglang-kernel whose device code must be built for the GPU (``arch``: the
    extension's name, ``common_ops``; its SASS and PTX architectures are read from the ELF's
    ``.nv_fatbin`` section on the host). ``first`` is the first
    release that has it: one version, or by compute-capability major for a generator (``{12: 0.6.17}``),
    each checked against the real wheels (tests/integration/test_kernel_libraries.py)."""

    provider: str            # flashinfer | sglang | sgl_kernel | deep_gemm
    what: str                # the kernel path in words ("the fused all-reduce + RMSNorm kernel (trtllm_comm)")
    file: str                # under the provider's package dir ("jit/comm.py")
    name: str | None = None  # the generator or symbol in ``file``; None: the file itself (a module)
    kind: str = "module"     # generator | symbol | module | arch
    first: Mapping[int, str] | str | None = None

    @property
    def where(self) -> str:
        return f"{self.provider}/{self.file}"


PROVIDERS = ("flashinfer", "sglang", "sgl_kernel", "deep_gemm")
FIT_KINDS = ("tp_size", "tp_at_most_without_nvlink", "dtype", "deterministic", "interconnect", "p2p",
             "capability_major_in", "weights")


@frozen
class Fit:
    """A condition of the host (not of its GPU generation) under which SGLang runs a feature
    (``fits:`` in the catalog; judged by gates/fits.py): ``kind`` one of ``FIT_KINDS`` with its
    ``value``; ``at``: where the release says so, ``(FILE, REGEX)`` candidates under the sglang
    package tried in order (the first that matches on the host gives file:line, and for
    ``tp_size`` its own list); ``capability_major_in`` names a dict whose int keys are read there."""

    kind: str
    value: Any
    why: str
    at: tuple[tuple[str, str], ...] = ()


@frozen
class Feature:
    """One feature of the catalog: how to recognise the gates on its path (``rules``), the flags or environment
    that switch it on, what its kernel library and the host must admit, and what a patch may widen."""

    name: str
    title: str
    keywords: tuple[re.Pattern[str], ...]
    flags: tuple[FlagChoice, ...]
    rules: tuple[GateRule, ...]
    widen: tuple[str, ...]
    default: str = "off"    # what SGLang does with no flag: on | auto | off
    combine: str = "all"    # runtime gates: "all" must admit (checks on one path) | "any" (alternative paths)
    patchable: bool = False  # has a `patch:` section (its files are returned whole for the patch planner)
    # `patch: needs_p2p:` why the patched feature needs peer-to-peer between the TP group's GPUs
    # (a patch is then refused where a pair lacks it, unless the role allows it); None: it does not.
    needs_p2p: str | None = None
    kernels: tuple[KernelNeed, ...] = ()   # what the kernel library must admit too (gates/kernels.py)
    fits: tuple[Fit, ...] = ()             # what the host must be like (gates/fits.py)
    # The environment that switches the feature on (`env:`, SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1).
    env: Mapping[str, str] = field(default_factory=dict)
    # An all-reduce path of the TP group (`all_reduce: true`): never in effect at TP 1, where SGLang
    # builds no all-reduce communicator and its all_reduce returns the input (parallel_state.py).
    all_reduce: bool = False

    def classify(self, gate: Mapping[str, Any], runtime_files: frozenset[str] | None = None) -> GateRule | None:
        """The first rule that matches; scoped rules only once ``runtime_files`` is known."""
        for rule in self.rules:
            if rule.scope == "runtime_files" and (runtime_files is None or str(gate.get("file")) not in runtime_files):
                continue
            if rule.matches(gate):
                return rule
        return None

    def names_feature(self, text: str) -> bool:
        return any(p.search(text) for p in self.keywords)


@frozen
class Catalog:
    """The loaded gate catalog: its features, and SGLang's defaults for the settings gates test (used for the
    flags a running server was not given)."""

    features: tuple[Feature, ...]
    server_defaults: Mapping[str, Any] = field(default_factory=dict)

    def feature(self, name: str) -> Feature:
        for feature in self.features:
            if feature.name == name:
                return feature
        known = ", ".join(f.name for f in self.features)
        raise GpuopsError(f"gate catalog: no feature {name!r} (known: {known})")


def gate_context(gate: Mapping[str, Any]) -> str:
    """What a gate is about, apart from its own condition: where it sits and what it does."""
    effect = gate.get("effect") or {}
    parts = [str(gate.get("function", "")), *[str(w) for w in gate.get("within") or ()],
             str(effect.get("message") or ""), json.dumps(effect.get("returns"))]
    return "\n".join(parts)


def load_catalog(path: str | Path | None = None) -> Catalog:
    """The built-in catalog, or the YAML file at ``path``; a malformed file is a ``GpuopsError``.

    A file is parsed once per process while it stays the same file (path, size, mtime, inode):
    `inspect host` asks for the catalog ten times a host (advise's ways, the kernel and fit judges),
    and each parse of the built-in one took ~5 ms of CPU. What comes back is shared between callers:
    its classes are frozen and its few mappings (server defaults, a feature's env) are only read."""

    # The built-in one lies beside this module (what importlib.resources.files() gives for a package
    # on disk, without the ~5 ms of importing importlib.resources).
    file, name = (BUILTIN_CATALOG, "gpuops/gates/catalog.yaml") if path is None else (Path(path), str(path))
    try:
        info = file.stat()
        return _parsed_catalog(str(file), name, info.st_size, info.st_mtime_ns, info.st_ino)
    except OSError as exc:
        if path is None:
            raise
        raise GpuopsError(f"{name}: cannot read the gate catalog: {exc.strerror}") from None


@functools.lru_cache(maxsize=8)
def _parsed_catalog(file: str, name: str, size: int, mtime_ns: int, inode: int) -> Catalog:
    """The catalog in ``file`` as it was when it had this size, mtime and inode (the cache's key)."""
    text = Path(file).read_text(encoding="utf-8")
    return catalog_from_data(parse_yaml_text(text, name), name)


def catalog_from_data(data: Any, name: str = "catalog") -> Catalog:
    if not isinstance(data, dict) or not isinstance(data.get("features"), dict):
        raise GpuopsError(f"{name}: expected a mapping with a 'features' mapping")
    defaults = data.get("server_defaults") or {}
    if not isinstance(defaults, dict):
        raise GpuopsError(f"{name}: 'server_defaults' must be a mapping")
    return Catalog(tuple(_feature(fname, body, name) for fname, body in data["features"].items()), dict(defaults))


def _feature(fname: str, body: Any, name: str) -> Feature:
    where = f"{name}: feature {fname!r}"
    if not isinstance(body, dict):
        raise GpuopsError(f"{where}: expected a mapping")
    rules = body.get("gates")
    # A feature SGLang does not gate by GPU generation (a module switched on by an environment
    # variable) has no gate rules; its kernel needs then decide alone.
    if not isinstance(rules, list) or (not rules and not body.get("kernels")):
        raise GpuopsError(f"{where}: 'gates' must be a non-empty list of rules (or empty, with 'kernels')")
    flags = []
    for item in body.get("flags") or []:
        if not isinstance(item, dict) or not item.get("setting") or not item.get("flag"):
            raise GpuopsError(f"{where}: each flag needs 'setting' and 'flag'")
        flags.append(FlagChoice(str(item["setting"]), str(item["flag"]), tuple(str(v) for v in item.get("values") or ()),
                                bool(item.get("selects")), bool(item.get("inverse"))))
    raw_default = body.get("default", "off")
    # YAML 1.1 reads a bare on/off as a boolean.
    default = {True: "on", False: "off"}.get(raw_default, str(raw_default)) if isinstance(raw_default, bool) else str(raw_default)
    if default not in DEFAULTS:
        raise GpuopsError(f"{where}: 'default' must be one of {', '.join(DEFAULTS)}")
    patch = body.get("patch") or {}
    if not isinstance(patch, dict):
        raise GpuopsError(f"{where}: 'patch' must be a mapping")
    widen = tuple(patch.get("widen") or ("runtime", "auto_enable"))
    if set(widen) - set(ROLES):
        raise GpuopsError(f"{where}: 'patch: widen' must list roles among {', '.join(ROLES)}")
    needs_p2p = patch.get("needs_p2p")
    return Feature(
        name=str(fname),
        title=str(body.get("title") or fname),
        keywords=tuple(_regex(k, where) for k in body.get("keywords") or ()),
        flags=tuple(flags),
        rules=tuple(_rule(i, r, where) for i, r in enumerate(rules)),
        widen=widen,
        default=default,
        combine=_combine(body.get("combine", "all"), where),
        patchable="patch" in body,
        needs_p2p=" ".join(str(needs_p2p).split()) if needs_p2p else None,
        kernels=tuple(_kernel_need(i, k, where) for i, k in enumerate(body.get("kernels") or ())),
        fits=tuple(_fit(i, f, where) for i, f in enumerate(body.get("fits") or ())),
        env={str(k): str(v) for k, v in (body.get("env") or {}).items()},
        all_reduce=body.get("all_reduce") is True,
    )


def _fit(index: int, body: Any, where: str) -> Fit:
    here = f"{where}: fits entry {index + 1}"
    kinds = [k for k in FIT_KINDS if isinstance(body, dict) and k in body]
    if len(kinds) != 1:
        raise GpuopsError(f"{here}: give exactly one of {', '.join(FIT_KINDS)}")
    at = []
    for item in _strings(body.get("at")):
        file, sep, pattern = item.partition("::")
        if not sep or not pattern or file.startswith("/") or ".." in file.split("/"):
            raise GpuopsError(f"{here}: 'at' must be FILE::REGEX under the sglang package")
        _regex(pattern, here)
        at.append((file, pattern))
    return Fit(kind=kinds[0], value=body[kinds[0]], why=" ".join(str(body.get("why") or "").split()), at=tuple(at))


def _kernel_need(index: int, body: Any, where: str) -> KernelNeed:
    here = f"{where}: kernels entry {index + 1}"
    if not isinstance(body, dict) or body.get("provider") not in PROVIDERS:
        raise GpuopsError(f"{here}: 'provider' must be one of {', '.join(PROVIDERS)}")
    kinds = [k for k in ("generator", "symbol", "module", "arch") if body.get(k)]
    if len(kinds) != 1:
        raise GpuopsError(f"{here}: give exactly one of generator (FILE::FUNCTION), symbol (FILE::NAME), module (FILE) "
                          "or arch (an extension's name)")
    kind = kinds[0]
    if (kind == "arch") != (body.get("provider") == "sgl_kernel"):
        raise GpuopsError(f"{here}: arch (compiled architectures) is for the sgl_kernel provider, and only it")
    text = str(body[kind])
    file, sep, name = text.partition("::")
    if kind not in ("module", "arch") and (not sep or not name):
        raise GpuopsError(f"{here}: {kind} must be written FILE::NAME (jit/comm.py::gen_trtllm_comm_module)")
    if file.startswith("/") or ".." in file.split("/"):
        raise GpuopsError(f"{here}: {file!r} must be a path under the package")
    first = body.get("first")
    if isinstance(first, dict):
        try:
            first = {int(k): str(v) for k, v in first.items()}
        except ValueError:
            raise GpuopsError(f"{here}: 'first' by major must map integers to versions") from None
    elif first is not None:
        first = str(first)
    return KernelNeed(provider=str(body["provider"]), what=" ".join(str(body.get("what") or text).split()),
                      file=file, name=name or None, kind=kind, first=first)


def _combine(value: Any, where: str) -> str:
    if value not in ("all", "any"):
        raise GpuopsError(f"{where}: 'combine' must be all or any")
    return str(value)


def _rule(index: int, rule: Any, where: str) -> GateRule:
    here = f"{where}: gate rule {index + 1}"
    if not isinstance(rule, dict) or rule.get("role") not in ROLES:
        raise GpuopsError(f"{here}: 'role' must be one of {', '.join(ROLES)}")
    match = rule.get("match")
    if not isinstance(match, dict) or not match or set(match) - set(_MATCH_KEYS):
        raise GpuopsError(f"{here}: 'match' must use only {', '.join(_MATCH_KEYS)}")
    scope = rule.get("scope")
    if scope not in (None, "runtime_files"):
        raise GpuopsError(f"{here}: 'scope' can only be runtime_files")
    return GateRule(
        role=str(rule["role"]),
        why=" ".join(str(rule.get("why") or "").split()),
        scope=scope,
        context=tuple(_regex(p, here) for p in _strings(match.get("context"))),
        sets=tuple(_strings(match.get("sets"))),
        reads=tuple(_strings(match.get("reads"))),
        message=_regex(match["message"], here) if "message" in match else None,
        function=tuple(_strings(match.get("function"))),
        kind=tuple(_strings(match.get("kind"))),
        path=" ".join(str(rule["path"]).split()) if rule.get("path") else None,
    )


def _strings(value: Any) -> Sequence[str]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


def _regex(pattern: Any, where: str) -> re.Pattern[str]:
    try:
        return re.compile(str(pattern), re.IGNORECASE)
    except re.error as exc:
        raise GpuopsError(f"{where}: bad regex {pattern!r}: {exc}") from None
