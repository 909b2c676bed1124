"""Gate scan, worker processes: the selected files are shared by size over ``jobs`` forked workers;
each loads its share and sends back its definitions, gets everyone's, then walks its files. Only
plain data (dicts, lists, strings) crosses the pipes, pickled. Any failure: the caller scans
serially. Host code: stdlib only, Python 3.8+ (``os.fork``)."""

import os
import pickle
import struct


def run_forked(scanner, selected, jobs):
    """The same scan over ``jobs`` forked workers (each parses and walks its share; definitions
    are exchanged in between). None when anything goes wrong: the caller scans serially."""
    buckets = [[] for _ in range(jobs)]
    sizes = [0] * jobs
    for rel in sorted(selected, key=lambda r: -len(scanner.texts[r])):
        i = sizes.index(min(sizes))
        buckets[i].append(rel)
        sizes[i] += len(scanner.texts[rel])
    children = []
    try:
        for bucket in buckets:
            up_r, up_w = os.pipe()
            down_r, down_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker
                os.close(up_r)
                os.close(down_w)
                code = 0
                try:
                    worker(scanner, bucket, os.fdopen(up_w, "wb"), os.fdopen(down_r, "rb"))
                except BaseException:
                    code = 1
                os._exit(code)
            os.close(up_w)
            os.close(down_r)
            children.append((pid, os.fdopen(up_r, "rb"), os.fdopen(down_w, "wb")))
        per_file = {}
        errors = []
        for _, up, _ in children:
            message = receive(up)
            per_file.update(message[0])
            errors.extend(message[1])
        scanner.set_tables(per_file)
        for _, _, down in children:
            send(down, per_file)
            down.close()
        gates, predicates, parsed = [], [], 0
        for _, up, _ in children:
            message = receive(up)
            gates.extend(message[0])
            predicates.extend(message[1])
            errors.extend(message[2])
            parsed += message[3]
    except (OSError, EOFError, ValueError, pickle.PickleError):
        return None
    finally:
        for pid, up, down in children:
            for handle in (up, down):
                try:
                    handle.close()
                except OSError:
                    pass
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
    scanner.errors.extend(errors)
    scanner.predicates = sorted(predicates, key=lambda p: (p["file"], p["name"]))
    scanner.parsed_count = parsed
    return gates


def worker(scanner, bucket, up, down):
    scanner.errors = []
    scanner.load(scanner.select(bucket), ())
    send(up, (scanner.local_tables(), scanner.errors))
    scanner.errors = []
    scanner.set_tables(receive(down))
    scanner.reload_extra()
    gates = scanner.walk_all()
    send(up, (gates, scanner.predicate_table(), scanner.errors, len(scanner.files)))
    up.close()


def send(handle, obj):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    handle.write(struct.pack("<Q", len(data)))
    handle.write(data)
    handle.flush()


def receive(handle):
    head = handle.read(8)
    if len(head) != 8:
        raise EOFError("a scan worker stopped")
    size = struct.unpack("<Q", head)[0]
    data = handle.read(size)
    if len(data) != size:
        raise EOFError("a scan worker stopped")
    return pickle.loads(data)
