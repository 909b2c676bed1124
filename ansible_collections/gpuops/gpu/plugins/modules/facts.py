# The work is done by the action plugin of the same name (on the controller, with gpuops installed).
DOCUMENTATION = r"""
module: facts
short_description: gpuops facts and SGLang capability gates of a GPU host
description:
  - Runs gpuops' gather (GPUs, interconnect, software, the SGLang server) and gate scan on the host
    in one exec over Ansible's connection, and returns the document C(gpuops inspect host --json)
    gives for that host. gpuops must be installed in the Python that runs Ansible.
options:
  gates:
    description: Also scan and judge SGLang's capability gates.
    type: bool
    default: true
author: gpuops maintainers
"""
RETURN = r"""
gpuops:
  description: The host's entry of C(gpuops inspect host --json) (schema in gpuops' docs/inspect-json.md).
  returned: always
  type: dict
"""
