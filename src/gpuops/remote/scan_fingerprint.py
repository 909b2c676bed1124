"""The gate scan's fingerprint: a cheap digest of everything a scan's result depends on (host side).

A full gate scan parses SGLang's source with ``ast`` (seconds of CPU on a real release); its result
depends only on the scanner's code and options, the python that parses (``ast`` differs between
versions), the package root that python finds, the release's version string and the ``.py`` files
under that root. So the host digests exactly those, with a stat walk instead of reading the files
(``tree_fingerprint`` on ``~/.cache/gpuops/sglang/{0.5.8,0.5.23}/site/sglang``, SGLang 0.5.8's 1,199
files and 0.5.23's 4,719: medians 6.7 ms and 27.9 ms of 5 runs each, page cache warm, this project's
2-core machine at load average 2.1), and the client that already holds the scan of that digest is told "unchanged"
instead of being sent the scan again (``gpuops/gates/scan_cache.py`` keeps them).

Not the root's path: the tree is named by its files, so a tree hard-linked under another root (the
lab's hosts link one unpacked release; uv installs hard-link from its cache) or laid out alike on a
cloned machine has the same fingerprint, and a client that scanned one such tree offers that scan to
the others (``gates/scan_cache.py``). The root's device is in, so that on one machine two trees share a
fingerprint only when they are the very same files (the same inodes); a copy has new inodes.

Per file: its path under the root, size, mtime_ns and inode. Every write through a rename (gpuops'
own atomic writes and its rollbacks, pip, ``sed -i``, most editors) gives the file a new inode, and
any other write sets the mtime to now. Not the ctime: it also changes when a hard link to the file
is made or removed (pip's caches, and the lab, whose hosts hard-link one unpacked release), which
would make every scan a miss. Known limit, left as it is: an edit in place that keeps the size and
then puts the old mtime back (``touch -d``), or one made within the same clock tick as the scan's
read of that file, is not seen; such a host keeps being told its old scan until another change.

Two ways in: the scanner calls ``tree_fingerprint`` before it reads anything (and answers
"unchanged" itself when the client offered that fingerprint), and the probe first runs this module
on its own (``check_main``) when the client offers any: on a match it prints the short answer and
the scanner (~100 KB of Python to compile) never starts; otherwise it prints nothing and exits
``NOT_KEPT``, and the scanner runs.

Stdlib only, Python 3.8+.
"""

import hashlib
import json
import os
import sys

# Bumped whenever the scanner reads the same tree differently (2: effect shapes and if/elif chains,
# 3: constant methods and parameters, 4: a predicate's argument clauses, the sentinel effect, what
# callers pass; issue 29; 5: a CUDA version's major read into a local, 6: early-return chains,
# 7: a logged fallback before `return <value>` after a test the GPU passes, 8: an architecture-list
# suffix added by `A if test else B`, 9: callers through a returned function and one caller up,
# 10: a compiler math mode chosen by `A if test else B` and the local read only so, 11: a body
# that only selects a value, 12: `get_cuda_version()[0]` and a module alias an `if X and ...: else: X = False`
# narrows, 13: a body that only turns a setting off or only logs that it does, 14: only the log of it
# (the switch-off is a branch again), a returned value selects, dict-override keys, a size rounded up
# adjusts, a setter's literal settings, a method a sibling reads negated; issue 43; 15: a chain's
# branch that only picks what its generic path picks, a selection under an if/else of its own, a
# math mode chosen by early returns, numbers per architecture in an if/else (issue 43, fix 12); 16:
# lambdas as call sites of a parameter's values, a module-level lambda nothing names again marked
# `unused` (issue 43, fix 14)), so that a scan kept from an older reading is never offered as this one's.
FINGERPRINT_FORMAT = 16
NOT_KEPT = 3  # check_main's exit status when the scanner must run
SCANNER_VERSION = 1  # of the scanner's JSON, which the short answer stands for; gate_scan imports it from here
# Options that change what a scan finds. ``with_sources`` (which files come back whole) is not one:
# the client keeps a scan with sources and uses it for a request without; ``jobs`` only sets the speed.
_IGNORED_OPTIONS = ("known", "with_sources", "jobs")


def python_files(root):
    """(path under root, stat) of every ``.py`` file below ``root`` (a superset of what the scanner
    reads: it also skips tests and dot directories), in a stable order."""
    found = []
    pending = [""]
    while pending:
        rel = pending.pop()
        with os.scandir(os.path.join(root, rel) if rel else root) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        pending.append(rel + entry.name + "/")
                elif entry.name.endswith(".py"):
                    found.append((rel + entry.name, os.stat(entry.path)))  # follows a symlinked file, as the scanner's open does
    found.sort(key=lambda item: item[0])
    return found


def tree_fingerprint(root, opts, version):
    """The hex digest of a scan's inputs under ``root``; None when the tree cannot be walked
    (an unreadable directory: then the scan runs and is not cached)."""
    digest = hashlib.sha256()
    options = {k: v for k, v in (opts or {}).items() if k not in _IGNORED_OPTIONS}
    try:
        device = os.stat(root).st_dev
        files = python_files(root)
    except OSError:
        return None
    head = [FINGERPRINT_FORMAT, sys.version, sys.implementation.name, os.path.realpath(sys.executable),
            device, version, options]
    digest.update(json.dumps(head, sort_keys=True, default=str).encode("utf-8"))
    for rel, info in files:
        digest.update(("\n%s\0%d\0%d\0%d" % (rel, info.st_size, info.st_mtime_ns, info.st_ino)).encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def known_fingerprints(opts):
    """The fingerprints of the scans the client already holds for this host (the ``known`` option)."""
    known = (opts or {}).get("known")
    if not isinstance(known, list):
        return ()
    return tuple(k for k in known if isinstance(k, str) and k)


def unchanged_answer(result, fingerprint):
    """The short answer when the client holds the scan of ``fingerprint``: the scanner's header
    (version, python, root, release) and no gates."""
    answer = dict(result)
    answer.update({"ok": True, "unchanged": True, "fingerprint": fingerprint})
    return answer


def check_main(argv):
    """Run as the entry: the short answer and exit 0 when this tree's fingerprint is one the client
    offered; else nothing printed and ``NOT_KEPT``. Options and discovery are the scanner's own."""
    from gpuops.remote.scan_discovery import find_sglang, find_version, read_options

    opts, _ = read_options(argv)
    known = known_fingerprints(opts)
    if not known:
        return NOT_KEPT
    root, _ = find_sglang(opts)
    if root is None:
        return NOT_KEPT  # the scanner says why
    version = find_version(root)
    fingerprint = tree_fingerprint(root, opts, version)
    if fingerprint is None or fingerprint not in known:
        return NOT_KEPT
    header = {"scanner": SCANNER_VERSION, "python": "%d.%d.%d" % sys.version_info[:3], "root": root, "version": version,
              "answered_by": "fingerprint check"}
    sys.stdout.write(json.dumps(unchanged_answer(header, fingerprint), sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(check_main(sys.argv))
