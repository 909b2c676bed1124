"""gpuops gate scanner: find every GPU-generation gate in an installed SGLang, without importing it.

Runs on the host with the python of the host's SGLang install (stdlib only, Python 3.8+). Shipped
on stdin as ONE script, this entry with the ``scan_*`` modules it imports bundled in
(``gpuops.shipping.source("gate_scan")``, see ``shipping/bundle.py``), run as ``python - '<options JSON>'``;
prints ONE JSON document on stdout and always exits 0 (a problem is a ``"reason"``, not a crash).

A *gate* is a boolean expression that tests the GPU generation: a predicate call
(``is_sm100_supported()``), a module alias of one (``_is_sm100_supported``), a platform attribute
(``get_platform().is_sm100``) or a device-capability comparison (``get_device_capability()[0] >= 9``),
in an ``if``/``elif``/``while``/``assert``, a ``return``, an assignment or any other expression.
For each the scanner reports its condition as a small tree (and/or/not over capability atoms and
opaque clauses, with exact source spans), where it is, what it guards (raise message, returned
value, fields it sets) and an excerpt. It also reads what the predicates mean from their
definitions (``partial(_check_cuda_device_version, device_capability_majors=[12], ...)``, small
``def is_x(): return ...`` bodies, platform attribute tables). Judging against a host's GPU is
done by gpuops, not here.

Speed: a large release is ~70 MB of Python. Files are filtered by plain substring search, then only
the top-level statements (or class members) that mention a capability token are parsed; a file
whose pieces do not parse on its own is parsed whole.

The stages, one module each (in the order a file meets them):

- ``scan_discovery``: options, finding the ``sglang`` package and its version, listing its files
- ``scan_vocabulary``: the tokens and names a GPU test is made of
- ``scan_pieces``: cutting a file into top-level statements / class members, parsing the ones that matter
- ``scan_locator``: a node's exact span and text in the file
- ``scan_ast``: small AST helpers (dotted names, literals, statement walks)
- ``scan_fileinfo``: what one file defines (predicates, aliases, imports, capability values)
- ``scan_scope``, ``scan_values``, ``scan_tree``: the condition tree (what a name means where it is
  read; capability values as data flow from the device; and/or/not over atoms and clauses)
- ``scan_walker``: the statement walker that turns conditions into gates
- ``scan_effects``: what a gate's body does (a refusal, a fallback, a value it adjusts or selects)
- ``scan_callers``: who calls a function named for a GPU generation, and inside which tests
- ``scan_lookup``, ``scan_scanner``, ``scan_workers``: the whole scan (meanings across files, the
  run, and its forked worker processes)
"""

import gc
import json
import os
import re
import sys
import time

from gpuops.remote.scan_discovery import default_jobs, find_sglang, find_version, read_options
from gpuops.remote.scan_fingerprint import SCANNER_VERSION  # one source: the short answer stands for this JSON
from gpuops.remote.scan_scanner import Scanner


def gate_context(gate):
    effect = gate.get("effect") or {}
    parts = [gate["function"], gate.get("doc") or "", gate["text"], " ".join(gate.get("within") or []),
             effect.get("message") or "", json.dumps(effect.get("returns")), " ".join(effect.get("sets") or []),
             " ".join(gate.get("reads") or [])]
    return "\n".join(parts)


def scan(opts):
    """The scan, with the cyclic garbage collector off: the scan allocates millions of AST nodes
    and tables, nearly all freed by their refcounts, and the collector's passes over them were
    ~18% of a large scan's CPU (0.5.23: 617 collections, 0.55 s; left to the end, the few cycles
    are ~13,000 objects, and the peak memory is the same, 211 MB). Forked workers inherit it.
    Back on after (a caller in process keeps its collector)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _scan(opts)
    finally:
        if collecting:
            gc.enable()


def _scan(opts):
    started = time.time()
    cpu_started = time.process_time()
    result = {"scanner": SCANNER_VERSION, "python": "%d.%d.%d" % sys.version_info[:3], "ok": False}
    root, reason = find_sglang(opts)
    if root is None:
        result["reason"] = reason
        result["elapsed_s"] = round(time.time() - started, 3)
        return result
    result["root"] = root
    result["version"] = find_version(root)
    from gpuops.remote import scan_fingerprint  # the stat walk that lets a client keep its scan

    fingerprint = scan_fingerprint.tree_fingerprint(root, opts, result["version"])  # before reading: an edit during the scan changes the next one
    if fingerprint is not None and fingerprint in scan_fingerprint.known_fingerprints(opts):
        return scan_fingerprint.unchanged_answer(result, fingerprint)
    result["fingerprint"] = fingerprint
    scanner = Scanner(root)
    jobs = opts.get("jobs")
    jobs = default_jobs() if not isinstance(jobs, int) or jobs < 1 else jobs
    children_before = os.times()
    gates = scanner.run(jobs)
    result["ok"] = True
    result["jobs"] = jobs
    result["files_total"] = scanner.files_total
    result["files_parsed"] = scanner.parsed_count if scanner.parsed_count is not None else len(scanner.files)
    result["errors"] = scanner.errors
    result["predicates"] = scanner.predicates
    result["platform_attrs"] = scanner.platform_map
    result["gates"] = gates
    patterns = []
    for pattern in opts.get("keywords") or []:
        try:
            patterns.append(re.compile(pattern, re.I))
        except re.error:
            pass
    for error in scanner.errors:
        text = scanner.texts.get(error["file"], b"").decode("utf-8", "replace")
        error["matches"] = [p.pattern for p in patterns if p.search(text)]
    if opts.get("with_sources"):
        wanted = sorted({g["file"] for g in gates if not patterns or any(p.search(gate_context(g)) for p in patterns)})
        result["sources"] = {rel: scanner.texts[rel].decode("utf-8") for rel in wanted}
    children = os.times()
    result["elapsed_s"] = round(time.time() - started, 3)
    result["cpu_s"] = round(time.process_time() - cpu_started + (children.children_user - children_before.children_user)
                            + (children.children_system - children_before.children_system), 3)
    return result


def main(argv):
    opts, problem = read_options(argv)
    if opts is None:
        out = {"scanner": SCANNER_VERSION, "ok": False, "reason": problem}
    else:
        try:
            out = scan(opts)
        except Exception as exc:  # report, never a traceback on the host's side
            out = {"scanner": SCANNER_VERSION, "ok": False, "reason": "scanner failed: %s: %s" % (type(exc).__name__, exc)}
    sys.stdout.write(json.dumps(out, sort_keys=True))
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
