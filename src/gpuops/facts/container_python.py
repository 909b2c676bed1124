"""Probes of a docker-managed host, run with the container's python against the SGLang it has.

With ``sglang_manager: docker`` the SGLang files that matter live in the container's image, not on
the host: a gate scan with the host's python would audit whatever (if anything) the host has
installed. So the probes that read SGLang (the gate scanner, the package list) run with the
container's interpreter instead:

- the container is running: ``docker exec -i CONTAINER PYTHON`` (what it really has, including
  anything in its writable layer);
- it exists but is stopped: ``docker run --rm -i --network none --entrypoint PYTHON IMAGE_ID``
  (its own image, by id);
- there is none: the same with the image the inventory names (``sglang_docker_image``), when set.

The wrapper is sh that defines a function and points ``$GPUOPS_PY`` at it; the probe's own text is
unchanged (``"$GPUOPS_PY" - ARGS <<EOF``: sh looks the expanded word up as a function), so the
scanner is the same one every other host runs, and its stdin (the heredoc) reaches the container.
Probes run with stdin from /dev/null (``gather``), so ``-i`` never eats the gather script.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Callable, Mapping, TypedDict, TypeGuard
from gpuops.gather import Probe, ProbeOutput
from gpuops.frozen import frozen

FUNCTION = "gpuops_container_python"
CONTAINER_PROBE = "docker.container"


@frozen
class ContainerTarget:
    """Where a docker-managed host's SGLang lives: the container, its image, its python."""

    container: str
    image: str | None = None     # used only when no container of that name exists
    # The interpreter inside the image: the one the docker run script launches the server with
    # (templates/sglang-docker-run.sh.j2 runs ``python3 -m sglang.launch_server``). Not
    # ``sglang_python``: that names a python of the host.
    python: str = "python3"

    def describe(self) -> str:
        return f"{self.python} in container {self.container}"


def docker_target(vars: Mapping[str, object]) -> ContainerTarget | None:
    """The container of a host whose server runs under docker; None for the other managers."""
    if str(vars.get("sglang_manager") or "process") != "docker":
        return None
    container = str(vars.get("sglang_service") or "sglang")
    image = vars.get("sglang_docker_image")
    return ContainerTarget(container=container, image=str(image) if image else None)


def container_python_sh(target: ContainerTarget) -> str:
    """sh that makes ``$GPUOPS_PY`` run the container's python (see the module docstring)."""
    ctr, py = shlex.quote(target.container), shlex.quote(target.python)
    image = shlex.quote(target.image or "")
    missing = shlex.quote(f"gpuops: no container {target.container} on this host and no sglang_docker_image "
                          "to audit: the SGLang of a docker-managed server is read from its container")
    return "\n".join([
        f"{FUNCTION}() {{",
        f"  gpuops_ctr_state=$(docker inspect --type container -f '{{{{.State.Running}}}} {{{{.Image}}}}' {ctr} 2>/dev/null)",
        '  case "$gpuops_ctr_state" in',
        f'    "true "*) docker exec -i {ctr} {py} "$@" ;;',
        f'    "false "*) docker run --rm -i --network none --entrypoint {py} "${{gpuops_ctr_state#false }}" "$@" ;;',
        f'    *) if [ -n {image} ]; then docker run --rm -i --network none --entrypoint {py} {image} "$@"; '
        f"else echo {missing} >&2; return 3; fi ;;",
        "  esac",
        "}",
        f"GPUOPS_PY={FUNCTION}",
        f"GPUOPS_PY_REASON={shlex.quote(target.describe() + ': the server runs under docker (sglang_manager)')}",
        "export GPUOPS_PY GPUOPS_PY_REASON",
    ])


def image_python_sh(image: str, python: str) -> str:
    """sh that makes ``$GPUOPS_PY`` run ``python`` in a throwaway container of ``image`` (no network):
    the re-audit of a derived image before any container runs it."""
    py, img = shlex.quote(python), shlex.quote(image)
    return "\n".join([
        f'{FUNCTION}() {{ docker run --rm -i --network none --entrypoint {py} {img} "$@"; }}',
        f"GPUOPS_PY={FUNCTION}",
        f"GPUOPS_PY_REASON={shlex.quote(f'{python} in image {image}')}",
        "export GPUOPS_PY GPUOPS_PY_REASON",
    ])


def in_container(probe: Probe[object], target: ContainerTarget) -> Probe[object]:
    """``probe`` with ``$GPUOPS_PY`` pointed into the container (same name, same parse)."""

    parse = probe.parse
    if probe.name in ("software.python", "host.system"):
        parse = _named_python(probe.parse, target.describe())
    elif probe.name == "gates.scan":
        parse = _where_scanned(probe.parse, target.describe())
    return Probe(probe.name, container_python_sh(target) + "\n" + probe.script, parse)


def in_image_probe(probe: Probe[object], image: str, python: str) -> Probe[object]:
    """``probe`` with ``$GPUOPS_PY`` pointed into a throwaway container of ``image``."""

    name = f"{python} in image {image}"
    parse = probe.parse
    if probe.name in ("software.python", "host.system"):
        parse = _named_python(probe.parse, name)
    elif probe.name == "gates.scan":
        parse = _where_scanned(probe.parse, name)
    return Probe(probe.name, image_python_sh(image, python) + "\n" + probe.script, parse)


def in_image(script: str, image: str, python: str) -> str:
    """A probe's script run with ``python`` of ``image`` (the derived image's re-audit)."""
    return image_python_sh(image, python) + "\n" + script


def _named_python(parse: Callable[[ProbeOutput], object], name: str) -> Callable[[ProbeOutput], object]:
    """The system and package probes echo ``$GPUOPS_PY``; say which python that was, not the name
    of the sh function that reaches it."""

    def parse_named(output: ProbeOutput) -> object:
        value = parse(output)
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and getattr(value, "chosen_python", None) == FUNCTION:
            return dataclasses.replace(value, chosen_python=name)
        return value

    return parse_named


def _where_scanned(parse: Callable[[ProbeOutput], object], name: str) -> Callable[[ProbeOutput], object]:
    """A scan that could not run says where it looked (the container's python, not the host's)."""

    def parse_where(output: ProbeOutput) -> object:
        value = parse(output)
        reason = getattr(value, "reason", None)
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and not getattr(value, "known", True) and reason and name not in reason:
            return dataclasses.replace(value, reason=f"{reason} ({name})")
        return value

    return parse_where


class ContainerFacts(TypedDict):
    """What ``docker inspect`` says of the server's container and its image (``parse_container``);
    ``id``, ``image`` and ``image_id`` as docker printed them, read as text where they are used."""

    name: str
    id: object
    image: object
    image_id: object
    running: bool
    labels: dict[str, object]


def is_container_facts(value: object) -> TypeGuard[ContainerFacts]:
    """``parse_container``'s answer, as the gather hands it on by probe name."""
    return (isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(value.get("running"), bool)
            and isinstance(value.get("labels"), dict))


def container_probe(target: ContainerTarget) -> Probe[ContainerFacts | None]:
    """What the container runs, as docker says: its image (reference and id) and that image's
    labels (a gpuops-derived image carries its patch hash and base). None when there is none."""

    ctr = shlex.quote(target.container)
    script = (
        f"gpuops_ctr=$(docker inspect --type container {ctr} 2>/dev/null) || {{ echo null; exit 0; }}\n"
        "printf '%s\\n' \"$gpuops_ctr\"\n"
        f"gpuops_img=$(docker inspect --type container -f '{{{{.Image}}}}' {ctr})\n"
        "docker image inspect \"$gpuops_img\" 2>/dev/null || echo null\n"
    )
    return Probe(CONTAINER_PROBE, script, parse_container)


def _object(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def parse_container(output: ProbeOutput) -> ContainerFacts | None:
    if output.exit_status != 0:
        raise ValueError(output.stderr.strip()[-300:] or f"exit status {output.exit_status}")
    decoder = json.JSONDecoder()
    text = output.stdout.strip()
    container, end = decoder.raw_decode(text)
    if not container:
        return None
    rest = text[end:].strip()
    image = decoder.raw_decode(rest)[0] if rest else None
    info = _object(container[0] if isinstance(container, list) else None)
    image_info = _object(image[0] if isinstance(image, list) and image else None)
    config = _object(info.get("Config"))
    name = info.get("Name")
    return {
        "name": (name if isinstance(name, str) else "").lstrip("/"), "id": info.get("Id"),
        "image": config.get("Image"), "image_id": info.get("Image"),
        "running": bool(_object(info.get("State")).get("Running")),
        "labels": _object(_object(image_info.get("Config")).get("Labels")),
    }
