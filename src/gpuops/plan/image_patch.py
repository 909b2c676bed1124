"""The fusion patch of a docker-managed server: a derived image, not files of the host.

A container's SGLang files live in its image; patching them in the running container (or on the
host) is lost at the next ``docker rm -f`` + ``docker run``, which is how gpuops itself restarts a
container. So for ``sglang_manager: docker`` the patched files become an image: the image the
container runs (by id: the bytes the gate scan read) plus the patched files, tagged by the patch's
hash (``gpuops/<container>:<hash>``), built on the host by ``remote/container_image.py`` without a
registry or network. The launch then names that image through the composed desired state (the role's
contribution carries ``image`` and the inventory image it stands in for, ``image_base``), so later
runs of other roles (``nccl-env``) keep it and ``gpuops rollback`` of this run takes it away with
the rest of the run's part.

Pure: reads the gathered facts (the in-container scan, ``docker inspect`` of the container) and
records changes of kind ``image`` (path ``TAG:/path/in/image``) that the helper builds, never writes.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING, Mapping, Sequence

from gpuops.errors import GpuopsError
from gpuops.plan.diff import unified_diff
from gpuops.plan.changes import BASE_REF_LABEL, PATCH_LABEL, AuditCheck, Change, ImageBuild

if TYPE_CHECKING:
    from gpuops.facts.container_python import ContainerFacts
    from gpuops.plan.state import PlanState
    from gpuops.plan.task import Task

REPOSITORY = "gpuops"


def repository_for(container: str) -> str:
    """A docker repository name from a container name (lower case, ``[a-z0-9._-]``)."""
    name = re.sub(r"[^a-z0-9._-]+", "-", container.lower()).strip("._-") or "sglang"
    return f"{REPOSITORY}/{name}"


def patch_hash(base: str, files: Sequence[tuple[str, str]]) -> str:
    """Hash of (base image id, every patched path and its new content): same patch, same tag."""
    blob = json.dumps({"base": base, "files": sorted([p, hashlib.sha256(a.encode()).hexdigest()] for p, a in files)},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def image_path(tag: str, path: str) -> str:
    """How an image file appears in a plan and its diffs: ``TAG:/path``."""
    return f"{tag}:{path}"


def path_in_image(tag: str, change_path: str) -> str:
    return change_path[len(tag) + 1:] if change_path.startswith(tag + ":") else change_path


def _base_of(state: "PlanState", inventory_image: str, where: str) -> tuple[str, ContainerFacts]:
    """The container gather saw (``docker inspect``), checked to run the inventory's image."""
    assert state.facts is not None
    container = state.facts.container
    if not container:
        raise GpuopsError(f"{state.host}: {where}: no docker container of the server on this host; start it with "
                          "`gpuops apply sglang-service` first (the patch is built from the image it runs)")
    labels = container["labels"]
    runs = container["image"]
    if runs != inventory_image and labels.get(BASE_REF_LABEL) != inventory_image:
        raise GpuopsError(f"{state.host}: {where}: the container {container.get('name')} runs image {runs}, not "
                          f"sglang_docker_image {inventory_image}; apply sglang-service first so that the patch is "
                          "built on the image the launch names")
    return str(container["image_id"]), container


def plan_image_patch(task: "Task", state: "PlanState", pending: Sequence[tuple[str, str, str]],
                     inventory_image: str, python: str, feature: str, target_sm: str,
                     recorded: Mapping[str, object] | None) -> dict[str, str]:
    """Changes of kind ``image`` for the patched files, the derived image to build, and the image
    the launch must name (the role's ``image`` / ``image_base``)."""
    base, container = _base_of(state, inventory_image, task.where)
    name = container["name"] or "sglang"
    if not pending:
        # Nothing left to patch in what the container runs: a rerun. The image the run recorded
        # stays the launch's (the container runs it; its tag was not recomputed from patched files).
        kept = dict(recorded or {})
        if kept.get("image") and kept.get("image_base") == inventory_image:
            return {"image": str(kept["image"]), "image_base": inventory_image}
        if container["labels"].get(PATCH_LABEL):
            return {"image": str(container["image"]), "image_base": inventory_image}
        return {"image": "", "image_base": ""}
    digest = patch_hash(base, [(path, after) for path, _, after in pending])
    tag = f"{repository_for(name)}:{digest[:12]}"
    for path, before, after in pending:
        shown = image_path(tag, path)
        state.add_change(Change(kind="image", path=shown, action="update", before=before, after=after,
                                diff=unified_diff(shown, before, after), mode=None, task=task.where,
                                notify=task.notify))
    state.image = ImageBuild(container=name, base=base, base_ref=inventory_image, tag=tag,
                             patch_sha256=digest, python=python)
    state.audit = AuditCheck(feature=feature, target_sm=target_sm, python=python)
    state.note(f"the patched files go into image {tag} (image {inventory_image} plus {len(pending)} patched "
               f"file(s)); the container is recreated from it")
    return {"image": tag, "image_base": inventory_image}
