# gpuops.gpu.role: run a gpuops role on the host (plan, change, restart, verify), through Ansible's connection.
from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.gpuops.gpu.plugins.module_utils.gpuops_action import host_and_runner


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("name", "vars"))
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec={
            "name": {"type": "str", "required": True},
            "vars": {"type": "dict", "default": {}},
        })
        try:
            from gpuops import ansible_bridge
            from gpuops.errors import GpuopsError
        except ImportError as exc:
            raise AnsibleActionFail(f"gpuops is not installed in the Python that runs Ansible: {exc}") from exc
        try:
            host, _ = host_and_runner(self, task_vars, own_connection=True)
            report = ansible_bridge.apply_role(host, args["name"], args["vars"], check=self._task.check_mode)
        except GpuopsError as exc:
            return {**result, "failed": True, "msg": str(exc)}
        result.update(changed=report["changed"] > 0 and report["ok"], gpuops=report)
        if not report["ok"]:
            result.update(failed=True, msg=report.get("error") or report["status"])
        return result
