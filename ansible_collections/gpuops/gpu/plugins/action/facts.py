# gpuops.gpu.facts: gpuops' facts and capability gates of the host, through Ansible's connection.
from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.gpuops.gpu.plugins.module_utils.gpuops_action import host_and_runner


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("gates",))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec={"gates": {"type": "bool", "default": True}})
        try:
            from gpuops import ansible_bridge
            from gpuops.errors import GpuopsError
        except ImportError as exc:
            raise AnsibleActionFail(f"gpuops is not installed in the Python that runs Ansible: {exc}") from exc
        host, runner = host_and_runner(self, task_vars)
        try:
            document = ansible_bridge.facts(host, runner, with_gates=args["gates"])
        except GpuopsError as exc:
            return {**result, "failed": True, "msg": str(exc)}
        result.update(changed=False, gpuops=document, ansible_facts={"gpuops": document})
        if not document.get("ok"):
            result.update(failed=True, msg=document.get("error") or "gpuops facts failed")
        return result
