# The work is done by the action plugin of the same name (on the controller, with gpuops installed).
DOCUMENTATION = r"""
module: role
short_description: Run a gpuops role on a GPU host
description:
  - Plans the gpuops role (nccl-env, sglang-service, fusion-sm120, ...) on the controller from one
    gather exec, then applies it in one exec through Ansible's connection - backups, atomic writes,
    restart on change, health check, automatic rollback, journal - as C(gpuops apply ROLE) does.
    Supports check mode.
options:
  name:
    description: The gpuops role.
    type: str
    required: true
  vars:
    description: Extra variables for the role (as gpuops' -e).
    type: dict
    default: {}
author: gpuops maintainers
"""
RETURN = r"""
gpuops:
  description: The host's entry of C(gpuops apply ROLE --json) (schema in gpuops' roles/README.md).
  returned: always
  type: dict
"""
