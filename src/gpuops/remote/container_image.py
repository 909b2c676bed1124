"""A derived image for a docker-managed server: its image plus gpuops' patched SGLang files.

Stdlib only, Python 3.8+: a host module, bundled with the apply helper. Files patched inside a
running container are lost at the next recreate, so the patch is baked into an image, locally
(no registry, no network): ``docker create`` of the base image (by id: the bytes the plan read),
``docker cp`` of each file out (its bytes must be what gpuops planned from, its mode and owner are
kept), ``docker cp`` of the patched files in (one tar), ``docker commit`` with the patch's labels
under the plan's tag (``gpuops/<container>:<patch hash>``), then a compile check of the patched
files with the image's own python in a throwaway container (``--network none``). The gate re-audit
that follows runs in the image too (the client sent its sh); only then is the container recreated.

A tag that already holds this patch (the same hash label) is reused, not rebuilt: a rerun, or the
recreate after someone replaced the container, costs nothing. An image this run built is removed
again when the run rolls back (after the previous container is back); one that existed is kept.

Every docker command runs through the apply run's one polled runner (``apply_commands.run_watched``:
output in files, the command's process group killed if the run's lease lapses, ``check`` raises), so
a client that dies mid-build leaves the original image running; the build container is removed even
then.
"""

import base64
import hashlib
import io
import json
import os
import tarfile
import time

from gpuops.remote.apply_commands import run_watched
from gpuops.remote.service_base import ServiceFailed
from gpuops.remote.host_protocol import EVENT_COMPILED, EVENT_IMAGE_BUILT, EVENT_IMAGE_KEPT, EVENT_IMAGE_REMOVED

_DOCKER_TIMEOUT_S = 600
# py_compile each path (argv) to a throwaway cfile: the image's tree gets no __pycache__ from us.
_COMPILE = (
    "import os,py_compile,sys,tempfile\n"
    "d=tempfile.mkdtemp()\n"
    "bad=0\n"
    "for i,p in enumerate(sys.argv[1:]):\n"
    "    try: py_compile.compile(p, cfile=os.path.join(d, '%d.pyc' % i), doraise=True)\n"
    "    except py_compile.PyCompileError as e: bad=1; sys.stderr.write(str(e.msg).strip()+'\\n')\n"
    "sys.exit(bad)\n"
)


def docker(argv, check, work_dir, stdin_data=None, timeout=_DOCKER_TIMEOUT_S):
    """``docker ARGV``: (exit status, stdout bytes, stderr text), through the apply run's one polled
    runner (``apply_commands.run_watched``): ``check()`` is called while it runs (it raises to abandon
    the run: the command is killed first); past ``timeout``, ServiceFailed. No docker: status 127."""
    try:
        status, out, err = run_watched(
            ["docker"] + list(argv), work_dir, check, timeout,
            lambda: ServiceFailed("docker %s took longer than %ds" % (argv[0], timeout)), stdin_data)
    except FileNotFoundError as exc:
        if exc.filename != "docker":
            raise
        return 127, b"", "docker not found on this host"
    return status, out, err.decode("utf-8", "replace").strip()


class ImageBuilder:
    """Builds and checks one derived image (``spec``: the payload's ``image``)."""

    def __init__(self, spec, check, work_dir, written=None):
        self.spec = spec
        self.tag = spec["tag"]
        self.check = check
        self.work_dir = work_dir
        # (path, bytes) -> the bytes to put in the image: the host's hooks (host_hooks.py) may see them
        self.written = written if written is not None else (lambda path, data: data)

    def run(self, *argv, **kwargs):
        return docker(list(argv), self.check, self.work_dir, **kwargs)

    def must(self, what, *argv, **kwargs):
        status, out, err = self.run(*argv, **kwargs)
        if status != 0:
            raise ServiceFailed("%s failed (docker %s, exit %d): %s" % (what, argv[0], status, err[-500:]))
        return out

    def existing_patch(self):
        """The patch label of an image already tagged so; None when there is no such image."""
        status, out, _ = self.run("image", "inspect", "--format", "{{json .Config.Labels}}", self.tag)
        if status != 0:
            return None
        labels = json.loads(out.decode() or "null") or {}
        return labels.get("gpuops.patch", "")

    def build(self):
        """Make the tag (unless it holds this patch already); True when this call built it."""
        have = self.existing_patch()
        if have == self.spec["patch_sha256"]:
            return False
        if have is not None:
            raise ServiceFailed("image %s exists but holds another patch (label gpuops.patch=%s); remove it "
                                "(docker rmi %s) and apply again" % (self.tag, have[:12] or "none", self.tag))
        base = self.spec["base"]
        config = json.loads(self.must("reading the base image", "image", "inspect", "--format", "{{json .Config}}",
                                      base).decode() or "{}") or {}
        # `docker create` needs a command when the image has none; the run script always gives one.
        command = [] if (config.get("Cmd") or config.get("Entrypoint")) else [self.spec.get("python") or "python3"]
        # A fixed name per patch: a build whose worker was killed (no `finally`) left this container
        # behind; the next build of the same patch removes it first. (A name, not a label: labels of
        # the container would be committed into the image.)
        name = "gpuops-build-" + self.spec["patch_sha256"][:12]
        self.run("rm", "-f", name)
        container = self.must("creating a container of the base image", "create", "--name", name, base,
                              *command).decode().strip()
        try:
            files = [self.patched_member(container, f) for f in self.spec["files"]]
            self.must("copying the patched files into the image", "cp", "-", container + ":/",
                      stdin_data=_tar(files))
            changes = []
            for key, value in sorted((self.spec.get("labels") or {}).items()):
                changes += ["--change", "LABEL %s=%s" % (key, json.dumps(str(value)))]
            self.must("docker commit", "commit", "-m", "gpuops: patched SGLang files", *(changes + [container, self.tag]))
        finally:
            # Not abandoned when the lease lapsed mid-build (that is when it matters): the build
            # container goes, or the host is not as it was.
            docker(["rm", "-f", container], lambda: None, self.work_dir, timeout=120)
        return True

    def patched_member(self, container, entry):
        """The tar header of ``entry``'s file in the base image (mode, owner) with the new bytes;
        refused when the image's bytes are not the ones gpuops planned from."""
        path = entry["path"]
        out = self.must("reading %s from the base image" % path, "cp", container + ":" + path, "-")
        with tarfile.open(fileobj=io.BytesIO(out)) as archive:
            member = archive.next()
            if member is None or not member.isfile():
                raise ServiceFailed("%s is not a regular file in image %s" % (path, self.spec["base"][:19]))
            handle = archive.extractfile(member)
            data = handle.read() if handle else b""
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry.get("before_sha256"):
            raise ServiceFailed(
                "%s in image %s is not what gpuops planned from (sha256 %s, plan saw %s: the container's copy "
                "differs from its image, or the image changed); nothing was changed, run gpuops apply again"
                % (path, self.spec["base"][:19], digest[:12], (entry.get("before_sha256") or "absent")[:12]))
        new = self.written(path, base64.b64decode(entry["after_b64"]))
        info = tarfile.TarInfo(path.lstrip("/"))
        info.mode, info.uid, info.gid = member.mode, member.uid, member.gid
        info.uname, info.gname = member.uname, member.gname
        info.size, info.mtime = len(new), int(time.time())
        return info, new

    def compile_check(self):
        """Compile the patched files with the image's own python, in a throwaway container."""
        python = self.spec.get("python") or "python3"
        paths = [f["path"] for f in self.spec["files"]]
        status, out, err = self.run("run", "--rm", "-i", "--network", "none", "--entrypoint", python, self.tag,
                                    "-", *paths, stdin_data=_COMPILE.encode())
        if status != 0:
            raise ServiceFailed("the patched files do not compile with %s in image %s: %s"
                                % (python, self.tag, (err or out.decode("utf-8", "replace")).strip()[-800:]))

    def remove(self):
        """``docker rmi`` (never forced: an image a container still uses stays)."""
        status, _, err = self.run("rmi", self.tag)
        return status == 0, err


def _tar(files):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, data in files:
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def build_for_run(run):
    """The apply helper's step after its writes: build (or reuse) and compile-check the derived
    image of ``run.payload["image"]``; remembers on ``run`` what it built (for the rollback)."""
    spec = run.payload.get("image")
    if not spec:
        return None
    run.phase("image_build")
    builder = ImageBuilder(spec, lambda: run.lease.check("while building image %s" % spec["tag"]), run.run_dir,
                           written=lambda path, data: run.hooks.written_data(run, path, data))
    started = time.monotonic()
    if builder.build():
        run.built_image = spec["tag"]
    run.progress({"event": EVENT_IMAGE_BUILT, "tag": spec["tag"], "built": bool(getattr(run, "built_image", None)),
                  "seconds": round(time.monotonic() - started, 2)})
    builder.compile_check()
    run.progress({"event": EVENT_COMPILED, "paths": [f["path"] for f in spec["files"]], "image": spec["tag"]})
    return spec["tag"]


def discard_built_image(run):
    """After a rollback put the previous container back: remove the image this run built (if any)."""
    tag = getattr(run, "built_image", None)
    if not tag:
        return
    try:
        removed, err = ImageBuilder(run.payload.get("image") or {"tag": tag}, lambda: None, run.run_dir).remove()
        run.progress({"event": EVENT_IMAGE_REMOVED if removed else EVENT_IMAGE_KEPT, "tag": tag, "why": err[-300:]})
    except Exception as exc:  # a leftover tagged image is harmless; a rollback must not fail for it
        run.progress({"event": EVENT_IMAGE_KEPT, "tag": tag, "why": "%s: %s" % (type(exc).__name__, exc)})


def _names_in_effect(state_dir, script):
    """The bytes that name images something may still run: the launch script, ``desired.json``
    (every run's part still in effect), and the backups of each run still in effect (those a
    rollback can write back) (undoing it puts back the launch it found, and the image that launch names).
    Plain rollbacks are left out: nothing undoes them, so what they found never comes back."""
    from gpuops.remote.apply_journal import read_journal
    from gpuops.remote.recompose import is_rollback, runs_in_order, standing, undone_runs

    texts = []
    for path in (script, os.path.join(state_dir, "desired.json")):
        try:
            with open(path, "rb") as handle:
                texts.append(handle.read())
        except (OSError, TypeError):
            pass
    runs = runs_in_order(read_journal(state_dir, []))
    undone = undone_runs(runs)
    for run in runs:
        if not standing(run, undone) or (is_rollback(run) and not run.get("recompose")):
            continue
        # Its backups only (what undoing it writes back), not its working files (audit.sh names the tag).
        for root, _, names in os.walk(os.path.join(state_dir, "runs", run["run_id"], "files")):
            for name in names:
                try:
                    with open(os.path.join(root, name), "rb") as handle:
                        texts.append(handle.read())
                except OSError:
                    pass
    return texts


def prune_derived_images(run, notes):
    """After a run finished (an apply, a rollback, a recomposition; after the pruning of old runs'
    backups): ``docker rmi`` each derived image of this server (``gpuops/<container>:*`` with a
    patch label) that nothing names any more. Kept: a tag the launch script, ``desired.json`` or a
    run still in effect names, the image the container runs, and any image docker refuses to
    remove (never forced: a container still uses it). Never fails the run: a tagged leftover is
    harmless, and the next run tries again."""
    service = (getattr(run, "payload", None) or {}).get("service") or {}
    if service.get("manager") != "docker" or not service.get("name"):
        return
    container = service["name"]
    try:
        def quiet(*argv):
            return docker(list(argv), lambda: None, run.run_dir, timeout=120)

        status, out, _ = quiet("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", "label=gpuops.patch",
                               "--filter", "reference=gpuops/%s:*" % container)
        if status != 0:
            return  # docker unreachable: nothing to judge
        tags = sorted(set(t for t in out.decode("utf-8", "replace").split() if not t.endswith(":<none>")))
        if not tags:
            return
        status, out, _ = quiet("inspect", "--type", "container", "--format", "{{.Config.Image}}", container)
        running = out.decode("utf-8", "replace").strip() if status == 0 else ""
        texts = _names_in_effect(run.state_dir, service.get("docker_run_script"))
        for tag in tags:
            if tag == running or any(tag.encode() in text for text in texts):
                continue
            status, _, err = quiet("rmi", tag)
            if status == 0:
                notes.append("removed the derived image %s: no run still in effect names it" % tag)
            else:
                notes.append("kept the derived image %s (docker rmi: %s)" % (tag, err[-200:]))
            run.progress({"event": EVENT_IMAGE_REMOVED if status == 0 else EVENT_IMAGE_KEPT, "tag": tag,
                          "why": "unused" if status == 0 else err[-300:]})
    except Exception as exc:  # see the docstring
        notes.append("derived images of %s not pruned: %s: %s" % (container, type(exc).__name__, exc))
