"""A gate read by its effect and its place (issue 29): the ways a body refuses (gates/README.md's
catalogue of effect shapes), platform branches, enclosing GPU tests, the sibling branch that serves
the GPU, and clauses false for the host's configuration. The scanner runs as on a host (a
subprocess with python3) on one small package; the judging is gpuops' own."""

from __future__ import annotations

import pytest
from rich.console import Console

from gpuops.gates.evaluate import judge
from gpuops.gates.report import gate_count_line, render_gate_detail
from test_gate_scanner_snippets import scan_files

FILES = {
    # -- effect shapes: each a refusal, so the GPU that passes is the one the code after serves
    "srt/error_string.py": """
        import torch

        def fallback_reason(q):
            if not q.is_cuda:
                return "non-CUDA tensors"
            if torch.cuda.get_device_capability(q.device) != (12, 0):
                return "device is not SM120"
            return None
        """,
    "srt/reason.py": """
        import torch

        def disable_reason(config):
            reason = None
            major, _ = torch.cuda.get_device_capability()
            if major < 9:
                reason = "shared experts fusion needs Hopper or newer"
            return reason
        """,
    "srt/accumulate.py": """
        import torch

        def check(device_capability):
            errors = []
            if torch.cuda.get_device_capability()[0] < 9:
                errors.append("CUDA compute capability 9.0 or newer is required")
            if errors:
                raise ValueError("; ".join(errors))
        """,
    "srt/fallback.py": """
        from sglang.srt.utils import is_sm100_supported

        def attn_method(batch):
            if not is_sm100_supported():
                return AttnMethod.MHA_CHUNKED_KV
            prepare(batch)
            return AttnMethod.TRTLLM
        """,
    # issue 43 (0.5.20 platforms/cuda.py:511): a test sm120 passes whose body logs that the path is
    # not supported and returns what it gets instead; a log that only names the choice selects
    "srt/logged_fallback.py": """
        from sglang.srt.utils import is_sm120_supported

        def resolve_fa():
            if is_sm120_supported():
                logger.info("FlashAttention is not supported on SM12.x in this build; falling back to Torch SDPA.")
                return AttentionBackendEnum.TORCH_SDPA
            return AttentionBackendEnum.FA

        def resolve_kernel():
            if is_sm120_supported():
                logger.info("Using the SM120 kernel for the attention backend")
                return "sm120_kernel"
            return "generic"
        """,
    "srt/selects.py": """
        from sglang.srt.utils import is_sm100_supported

        def resolve():
            if is_sm100_supported():
                return "mnnvl"
            return "trtllm"
        """,
    "srt/refusal_tuple.py": """
        import torch

        def qmul4_supported():
            major, minor = torch.cuda.get_device_capability()
            if major < 10:
                return False, f"QMUL4 kernel requires SM100/SM103, got sm{major}{minor}"
            return True, ""
        """,
    "srt/restrict.py": """
        from sglang.srt.utils import is_blackwell

        def pick(backend):
            if is_blackwell():
                assert backend in ("triton", "trtllm_mha"), "only these on Blackwell"
            return backend
        """,
    "srt/sentinel.py": """
        import torch

        def tiny_gemm_max_tokens(weight_dtype):
            major, _ = torch.cuda.get_device_capability()
            if major < 9 or weight_dtype != torch.bfloat16:
                return -1
            return 16
        """,
    # a predicate whose definition also tests what its caller passes (dtype, device)
    "srt/argument_predicate.py": """
        import torch

        def can_use_fused_rope(*, dtype, device):
            if not (device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)):
                return False
            major, _ = torch.cuda.get_device_capability(device)
            return major >= 9

        def can_use_named(arch, dtype):
            if not (arch in SUPPORTED_ARCHS and dtype == torch.float16):
                return False
            major, _ = torch.cuda.get_device_capability()
            return major >= 9

        def apply_fused_rope(q):
            if not can_use_fused_rope(dtype=q.dtype, device=q.device):
                raise ValueError("Unsupported fused rope inputs")
            return q

        def apply_named(q, arch):
            if not can_use_named(arch, q.dtype):
                raise ValueError("Unsupported")
            return q
        """,
    # a comparison for tuple arguments, while every caller passes a number
    "srt/tuple_param.py": """
        import torch

        class Platform:
            @classmethod
            def has_device_capability(cls, capability, device_id=0):
                current_capability = torch.cuda.get_device_capability(device_id)
                if isinstance(capability, tuple):
                    return current_capability >= capability
                return current_capability[0] * 10 + current_capability[1] >= capability

        class CudaPlatform(Platform):
            @classmethod
            def backend(cls):
                if not cls.has_device_capability(80):
                    return "torch_sdpa"
                return "flash_attn"
        """,
    "srt/logged_exit.py": """
        from sglang.srt.utils import get_device_sm

        def init_state(explicit, world_size):
            device_sm = get_device_sm()
            if device_sm not in (100, 103) or world_size not in (4, 8):
                message = (
                    "collective requires SM100/SM103 and TP4/TP8; using NCCL (sm=%s)" % (device_sm,)
                )
                (logger.warning if explicit else logger.info)(message)
                return None
            return build_state()
        """,
    # capabilities held in a function that returns a module constant, and in a local constant
    "srt/supported_table.py": """
        import torch

        SUPPORTED_CAPABILITIES = frozenset({(9, 0), (10, 0), (12, 0), (12, 1)})

        def supported_capabilities():
            return SUPPORTED_CAPABILITIES

        def unavailable_reason():
            capability = torch.cuda.get_device_capability()
            if capability not in supported_capabilities():
                return unsupported_reason(capability)
            return None

        def free_memory(gpu_id):
            SHARED_SYSMEM_SMS = (87, 110, 121)
            if torch.cuda.get_device_capability()[0] * 10 + torch.cuda.get_device_capability()[1] in SHARED_SYSMEM_SMS:
                return sysmem_available()
            return torch.cuda.mem_get_info(gpu_id)[0]
        """,
    # a class attribute set to a module constant; a subclass that sets its own makes it run-time
    "srt/class_table.py": """
        import torch

        H3_CAPABILITIES = frozenset({(8, 0), (9, 0), (10, 0), (10, 3)})
        OTHER_CAPABILITIES = frozenset({(12, 0)})

        class H3Resolver:
            supported_capabilities = H3_CAPABILITIES

            @classmethod
            def resolve(cls):
                capability = torch.cuda.get_device_capability()
                if capability not in cls.supported_capabilities:
                    raise ValueError("H3 needs compute capability 8.0, 9.0, 10.0 or 10.3")
                return "h3"

        class BaseResolver:
            supported_capabilities = H3_CAPABILITIES

            @classmethod
            def resolve(cls):
                capability = torch.cuda.get_device_capability()
                if capability not in cls.supported_capabilities:
                    raise ValueError("not supported on this device")
                return "base"

        class OtherResolver(BaseResolver):
            supported_capabilities = OTHER_CAPABILITIES
        """,
    # -- reachability through callers: functions written for one GPU, called where it is tested
    "srt/callers.py": """
        import torch
        from sglang.srt.utils import is_sm100_supported

        def _gemm_sm100(x):
            if torch.cuda.get_device_capability()[0] != 10:
                raise ValueError("the SM100 kernel runs on SM100 only")
            return x

        def _attn_sm100(x):
            if torch.cuda.get_device_capability()[0] != 10:
                raise ValueError("the SM100 kernel runs on SM100 only")
            return x

        def _norm_sm100(x):
            if torch.cuda.get_device_capability()[0] != 10:
                raise ValueError("the SM100 kernel runs on SM100 only")
            return x

        KERNELS = {"norm": _norm_sm100}

        def gemm(x):
            if is_sm100_supported():
                return _gemm_sm100(x)
            return x

        def attention(x):
            return _attn_sm100(x)
        """,
    # -- place: platform branches, enclosing GPU tests, sibling branches
    "srt/hip.py": """
        import torch
        from sglang.srt.utils import is_hip

        _is_hip = is_hip()

        def use_rowwise():
            if _is_hip:
                return torch.cuda.get_device_capability() >= (9, 4)
            return False
        """,
    "srt/aiter.py": """
        import os
        import torch
        from sglang.srt.utils import is_hip

        _is_hip = is_hip()
        _use_aiter = os.environ.get("SGLANG_USE_AITER") == "1" and _is_hip

        def backend():
            if torch.cuda.get_device_capability() >= (9, 4) and _use_aiter:
                return "aiter"
            return "triton"
        """,
    "srt/nested.py": """
        import torch

        def load_model():
            if torch.cuda.get_device_capability()[0] < 8:
                dtype = "float16"
                if torch.cuda.get_device_capability()[1] < 5:
                    raise RuntimeError("SGLang only supports sm75 and above.")
            return "bfloat16"
        """,
    "srt/dispatch.py": """
        from sglang.srt.utils import is_sm100_supported, is_sm120_supported, is_sm90_supported

        def gemm():
            if is_sm100_supported():
                return "cutlass_sm100"
            elif is_sm120_supported():
                return "cutlass_sm120"
            return "triton"

        def attention():
            if is_sm100_supported():
                return "trtllm_mha"
            elif is_sm90_supported():
                return "fa3"
            else:
                return "triton"
        """,
    "srt/config.py": """
        from sglang.srt.utils import is_sm100_supported

        class Model:
            def forward(self, server_args):
                if self.tp_size == 1 and is_sm100_supported():
                    return "single"
                if server_args.enable_fast_path and is_sm100_supported():
                    return "fast"
                if is_multicast_supported() and is_sm100_supported():
                    return "multicast"
                return "plain"

            def single_gpu_path(self):
                if self.tp_size == 1:
                    if not is_sm100_supported():
                        raise ValueError("the single-GPU path needs SM100")
                return "plain"
        """,
    # -- a capability held in a constant method or a parameter
    "srt/quant.py": """
        import torch
        from sglang.srt.utils import get_device_sm

        _is_npu = False

        class QuantConfig:
            @classmethod
            def get_min_capability(cls) -> int:
                \"\"\"Minimum capability.\"\"\"
                raise NotImplementedError

        class AWQConfig(QuantConfig):
            @classmethod
            def get_min_capability(cls) -> int:
                return 75

        class Fp8Config(QuantConfig):
            def get_min_capability(self) -> int:
                if _is_npu:
                    return 0
                return 100 if self.use_mxfp8 else 89

        def check(quant_config):
            capability = get_device_sm()
            if capability < quant_config.get_min_capability():
                raise ValueError("the quantization method is not supported on this GPU")
        """,
    "srt/at_least.py": """
        import torch

        _MIN_SM = (10, 0)

        def is_cuda_sm_at_least(min_sm):
            return torch.cuda.get_device_capability() >= min_sm

        def vae_output_fusable():
            return is_cuda_sm_at_least(_MIN_SM)
        """,
    # -- issue 29, part independent-3's patterns
    "srt/exit_call.py": """
        import sys
        from sglang.srt.utils import is_sm100_supported

        _SUPPORTED = is_sm100_supported()

        if __name__ == "__main__":
            if not _SUPPORTED:
                print("[skip] needs sm100")
                sys.exit(0)
            run()
        """,
    "srt/requirements.py": """
        import torch

        class Kernel:
            def __init__(self):
                sm_major = torch.cuda.get_device_capability()[0]
                if sm_major == 9:
                    if self._prefill_fn is None:
                        raise RuntimeError("prefill kernel is unavailable.")
                    if self._mtp_fn is None:
                        raise RuntimeError("MTP kernel is unavailable.")
                self.ready = True

        def resolve(trtllm_gen):
            if not trtllm_gen and torch.cuda.get_device_capability() == (9, 0):
                try:
                    from sageattention.sm90_compile import fixed_binding  # noqa: F401
                except ImportError:
                    logger.warning("missing the SM90 binding fix; falling back")
                    return "fa"
            return "sage"
        """,
    "srt/divert.py": """
        from sglang.srt.utils import is_sm100_supported

        def backend(target_backend, head_size, supported_sizes):
            if target_backend == "fa":
                fa4_head_size = is_sm100_supported() and head_size % 8 == 0
                if head_size not in supported_sizes and not fa4_head_size:
                    logger.info("Cannot use FlashAttention for head size %d.", head_size)
                    target_backend = "torch_sdpa"
            return target_backend
        """,
    "srt/nested_branch.py": """
        import torch
        from sglang.srt.utils import is_blackwell

        def select():
            major, _ = torch.cuda.get_device_capability()
            if major == 9:
                if major >= 9:
                    return "triton_attn"
                return "fa3"
            return "sdpa"
        """,
    # -- a refusal by the CUDA version read into a local (independent-5): `cuda_major < 13` is the
    # toolkit's major, not a setting of the server's
    "srt/cuda_major.py": """
        import torch

        class ServerArgs:
            def check_prefill(self):
                prefill = self.linear_attn_prefill_backend
                cuda_version = torch.version.cuda
                cuda_major = int(cuda_version.split(".")[0]) if cuda_version is not None else 0
                if prefill == "flashinfer" and torch.cuda.get_device_capability()[0] >= 10 and cuda_major < 13:
                    raise ValueError("flashinfer prefill on SM100+ requires CUDA 13+")

            def check_decode(self):
                cuda_major = int(torch.version.cuda.split(".")[0])
                if torch.cuda.get_device_capability()[0] >= 10 and cuda_major <= 12:
                    raise ValueError("flashinfer decode on SM100+ requires CUDA 13+")
        """,
    # -- a fast path turned off by the CUDA version as a tuple (independent-8, 0.5.15 gpt_oss.py:131):
    # the module flag is set by a GPU test, then `if flag and get_cuda_version()[0] < 13: ... else:
    # flag = False`, so past the `if` the flag also needs CUDA below 13
    "srt/tinygemm.py": """
        import torch
        from sglang.srt.utils import is_sm90_supported, is_blackwell_supported

        def get_cuda_version():
            if torch.version.cuda:
                return tuple(map(int, torch.version.cuda.split(".")))
            return (0, 0)

        _is_tinygemm_supported = is_sm90_supported() or is_blackwell_supported()

        if _is_tinygemm_supported and get_cuda_version()[0] < 13:
            try:
                from flashinfer.gemm import tinygemm_bf16
            except ImportError:
                tinygemm_bf16 = None
                _is_tinygemm_supported = False
        else:
            tinygemm_bf16 = None
            _is_tinygemm_supported = False

        class TinyGemmLinear:
            def __init__(self):
                self._use_tinygemm = _is_tinygemm_supported and self.weight.dtype == torch.bfloat16
        """,
    "srt/sail.py": """
        import torch

        def target_flags(arch):
            if is_sail_runtime():
                major, _ = torch.cuda.get_device_capability()
                if major < 13:
                    raise ValueError("unsupported SAIL arch")
            return ["-arch=sm_120"]
        """,
}


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    return scan_files(tmp_path_factory.mktemp("effects"), FILES)


def gates_of(scan, file):
    return [g for g in scan.gates if g["file"] == file]


def judged(scan, file, gpu="12.0", **kwargs):
    report = judge(scan, gpu, "13.0", **kwargs)
    return [g for g in report.gates if g["file"] == file]


@pytest.mark.parametrize("file, shape, on_sm120, on_other", [
    ("srt/error_string.py", "error_string", "open", ("9.0", "blocked")),
    ("srt/reason.py", "reason", "open", ("8.0", "blocked")),
    ("srt/accumulate.py", "accumulate", "open", ("8.0", "blocked")),
    ("srt/fallback.py", "fallback", "blocked", ("10.0", "open")),
    # `if is_sm120(): logger.info("... not supported ...; falling back ..."); return TORCH_SDPA`
    ("srt/logged_fallback.py", "fallback", "blocked", ("10.0", "open")),
    ("srt/refusal_tuple.py", "exit", "open", ("9.0", "blocked")),
    ("srt/sentinel.py", "sentinel", "open", ("8.0", "blocked")),
    # the message written and logged (by either of two loggers) before the refusal
    ("srt/logged_exit.py", "exit", "blocked", ("10.0", "open")),
    # The snippets' is_blackwell means major 10 only: sm100 is the GPU restricted here.
    ("srt/restrict.py", "restrict", "open", ("10.0", "blocked")),
    # `print(...); sys.exit(0)` under `if not _SUPPORTED:` at module level: sm120 stops there
    ("srt/exit_call.py", "exit", "blocked", ("10.0", "open")),
    # a GPU test whose body is only more refusals: an extra requirement for sm90, sm120 passes on
    ("srt/requirements.py", "requirements", "open", ("8.0", "open")),
    # inside `if target_backend == "fa":`, setting target_backend elsewhere: sm120 falls to SDPA
    ("srt/divert.py", "divert", "blocked", ("10.0", "open")),
])
def test_a_refusal_that_is_not_a_raise_flips_the_sense(scan, file, shape, on_sm120, on_other):
    gate = [g for g in gates_of(scan, file) if g["kind"] == "guard"
            and (file != "srt/requirements.py" or "sm_major" in g["text"])]
    assert len(gate) == 1, [(g["kind"], g["text"]) for g in gates_of(scan, file)]
    assert gate[0]["polarity"] == -1 and gate[0]["effect"]["shape"] == shape
    mine = next(g for g in judged(scan, file) if g["id"] == gate[0]["id"])
    assert (mine["status"], mine["shape"]) == (on_sm120, shape)
    other_gpu, other_status = on_other
    assert next(g for g in judged(scan, file, other_gpu) if g["id"] == gate[0]["id"])["status"] == other_status


def test_a_selected_value_is_a_branch_not_a_refusal(scan):
    (gate,) = gates_of(scan, "srt/selects.py")
    assert gate["kind"] == "if" and gate["polarity"] == 1 and "shape" not in gate["effect"]
    # logged first, the log naming the choice and refusing nothing: still sm120's own branch
    (logged,) = [g for g in gates_of(scan, "srt/logged_fallback.py") if g["function"] == "resolve_kernel"]
    assert logged["kind"] == "if" and logged["polarity"] == 1 and "shape" not in logged["effect"]
    assert next(g for g in judged(scan, "srt/logged_fallback.py") if g["id"] == logged["id"])["status"] == "open"
    assert judged(scan, "srt/selects.py")[0]["status"] == "blocked"  # sm120 does not get "mnnvl"
    assert judged(scan, "srt/selects.py", "10.0")[0]["status"] == "open"


@pytest.mark.parametrize("file", ["srt/hip.py", "srt/aiter.py"])
def test_another_platforms_branch_is_not_applicable_never_open(scan, file):
    (gate,) = judged(scan, file)
    assert gate["capability"] == "open"  # (12, 0) >= (9, 4): what a CUDA reading would say
    assert gate["status"] == "not_applicable"
    assert "NVIDIA host" in gate["reason"]


def test_a_refusal_inside_an_enclosing_test_the_gpu_fails_never_refuses_it(scan):
    inner = next(g for g in judged(scan, "srt/nested.py") if "[1] < 5" in g["condition"])
    assert inner["capability"] == "blocked"  # minor 0 < 5, read on its own
    assert inner["status"] == "open"
    assert "[0] < 8" in inner["unreachable"]
    # sm75 reaches it, and passes; sm70 is refused (a 7.x GPU, where the enclosing test holds).
    assert next(g for g in judged(scan, "srt/nested.py", "7.0") if g["id"] == inner["id"])["status"] == "blocked"


def test_a_sibling_that_serves_the_gpu_is_named_and_it_loses_nothing(scan):
    gemm = [g for g in judged(scan, "srt/dispatch.py") if g["function"] == "gemm"]
    first = next(g for g in gemm if "is_sm100" in g["condition"])
    elif_line = next(g for g in gemm if "is_sm120" in g["condition"])["line"]
    assert first["alternative"] == f"srt/dispatch.py:{elif_line}"
    # Its own branch (`elif is_sm120_supported()`): the sm100 kernel costs sm120 nothing (issue 43).
    assert (first["capability"], first["status"], first["skips"]) == ("blocked", "open", "own_branch")
    attention = [g for g in judged(scan, "srt/dispatch.py") if g["function"] == "attention"]
    # A plain `else:` is what every GPU falls to: sm120 loses trtllm_mha and fa3, shut out.
    assert [g["alternative"] for g in attention] == [None, None]
    assert all(g["status"] == "blocked" for g in attention)


def test_a_clause_false_for_the_hosts_configuration_marks_it_not_reached(scan):
    server = {"args": {"tp_size": "8"}, "architecture": None}
    by_text = {g["condition"]: g for g in judged(scan, "srt/config.py", "10.0", server=server,
                                                   interconnect={"nvlink": False})}
    single = by_text["self.tp_size == 1 and is_sm100_supported()"]
    assert single["capability"] == single["status"] == "open"  # the capability verdict is kept
    assert "tp_size == 1" in single["unreachable"] and "configuration" in single["unreachable"]
    # A feature switch is not the host's configuration: the gate still costs a GPU the feature.
    assert by_text["server_args.enable_fast_path and is_sm100_supported()"]["unreachable"] is None
    assert "PCIe" in by_text["is_multicast_supported() and is_sm100_supported()"]["unreachable"]
    # Without the host's facts nothing is said to be out of reach.
    assert all(g["unreachable"] is None for g in judged(scan, "srt/config.py", "10.0"))


def test_the_count_line_says_what_blocked_costs(scan):
    report = judge(scan, "12.0", "13.0")
    line = gate_count_line(report)
    blocked = [g for g in report.gates if g["status"] == "blocked"]
    # srt/nested_branch.py's inner branch: blocked because sm120 never reaches it, counted apart
    unreached = [g for g in blocked if g["unreachable"]]
    assert len(unreached) == 1
    # Only the losses are "blocked" (issue 43); the gate that sends sm120 to its own branch is open.
    assert (f"{len(blocked) - 1} blocked (sm120 loses something there), 1 not reached (on this host: its "
            "configuration), " in line)
    assert "3 for another platform" in line
    own = next(g for g in report.gates if g["skips"] == "own_branch")
    console = Console(record=True, width=200)
    render_gate_detail(report, console, show_all=True)
    text = console.export_text()
    assert f"its own path: {own['alternative']}" in text and "loses nothing: a branch for other GPUs" in text


@pytest.mark.parametrize("gpu, status", [("12.0", "open"), ("10.0", "open"), ("9.0", "unknown"), ("7.0", "blocked")])
def test_a_constant_method_is_read_over_every_class_that_defines_it(scan, gpu, status):
    # Its values: 75 (AWQ), 100 or 89 (FP8; the NPU branch's 0 is not a CUDA host's); the base
    # class raises. Which class runs is chosen at run time: decided where every value agrees.
    (gate,) = judged(scan, "srt/quant.py", gpu)
    assert gate["status"] == status, gate["reason"]
    if status == "unknown":
        assert "one of 75, 89, 100" in gate["reason"]


def test_a_parameter_every_caller_passes_a_constant_is_decided(scan):
    gate = next(g for g in judged(scan, "srt/at_least.py") if "min_sm" in g["condition"])
    assert gate["status"] == "open"  # (12, 0) >= (10, 0)
    assert next(g for g in judged(scan, "srt/at_least.py", "9.0") if g["id"] == gate["id"])["status"] == "blocked"


def test_a_predicates_tests_of_its_arguments_are_the_calls_clauses_not_unreadable(scan):
    # `device.type == "cuda"`, `dtype in (...)` in the definition test what the caller passes: the
    # GPU test is `major >= 9` (sm120 passes it, sm80 does not).
    gate = next(g for g in judged(scan, "srt/argument_predicate.py") if g["function"] == "apply_fused_rope")
    assert (gate["kind"], gate["status"]) == ("guard", "open"), gate["reason"]
    other = next(g for g in judged(scan, "srt/argument_predicate.py", "8.0") if g["id"] == gate["id"])
    assert other["status"] == "blocked"
    # An argument that names an architecture is part of the GPU test gpuops cannot read: unknown.
    named = next(g for g in judged(scan, "srt/argument_predicate.py") if g["function"] == "apply_named")
    assert named["status"] == "unknown" and "SUPPORTED_ARCHS" in named["reason"]


def test_a_comparison_no_caller_passes_a_value_of_its_kind_to_is_never_reached(scan):
    gates = {g["condition"]: g for g in judged(scan, "srt/tuple_param.py")}
    tuple_path = gates["current_capability >= capability"]
    assert tuple_path["status"] == "open" and "passes as 80" in tuple_path["unreachable"]
    # The number path is the one the caller's 80 takes: decided (sm75 fails it).
    number_path = gates["current_capability[0] * 10 + current_capability[1] >= capability"]
    assert number_path["status"] == "open" and number_path["unreachable"] is None
    assert next(g for g in judged(scan, "srt/tuple_param.py", "7.5") if g["id"] == number_path["id"])["status"] == "blocked"


def test_a_capability_held_in_a_function_returning_a_constant_or_in_a_local_constant_is_read(scan):
    (table,) = [g for g in judged(scan, "srt/supported_table.py") if g["function"] == "unavailable_reason"]
    assert table["status"] == "open" and table["admits"] == ["sm90", "sm100", "sm120", "sm121"]
    assert next(g for g in judged(scan, "srt/supported_table.py", "10.3") if g["id"] == table["id"])["status"] == "blocked"
    (local,) = [g for g in judged(scan, "srt/supported_table.py") if g["function"] == "free_memory"]
    assert local["status"] == "blocked" and local["admits"] == ["sm87", "sm110", "sm121"]


def test_a_refusal_inside_a_condition_false_for_the_hosts_configuration_never_refuses_it(scan):
    def refusal(**kwargs):
        return next(g for g in judged(scan, "srt/config.py", **kwargs) if g["function"] == "Model.single_gpu_path")
    assert refusal()["status"] == "blocked"  # without the host's settings: it refuses sm120
    tp8 = refusal(server={"args": {"tp_size": "8"}, "architecture": None})
    assert (tp8["capability"], tp8["status"]) == ("blocked", "open")
    assert "self.tp_size == 1" in tp8["unreachable"] and "configuration" in tp8["unreachable"]
    assert refusal(server={"args": {"tp_size": "1"}, "architecture": None})["status"] == "blocked"


def test_a_gate_whose_every_caller_is_closed_on_the_gpu_is_not_reached(scan):
    by_function = {g["function"]: g for g in judged(scan, "srt/callers.py")}
    gemm = by_function["_gemm_sm100"]
    assert (gemm["capability"], gemm["status"]) == ("blocked", "open")
    assert "every caller is closed on sm120" in gemm["unreachable"] and "is_sm100_supported()" in gemm["unreachable"]
    # sm100 reaches it through the same caller, and passes
    assert next(g for g in judged(scan, "srt/callers.py", "10.0") if g["id"] == gemm["id"])["status"] == "open"
    # called with no test around it; or stored in a table (called from anywhere): it refuses sm120
    assert by_function["_attn_sm100"]["status"] == "blocked" and by_function["_attn_sm100"]["unreachable"] is None
    assert by_function["_norm_sm100"]["status"] == "blocked" and by_function["_norm_sm100"]["unreachable"] is None


@pytest.mark.parametrize("function", ["ServerArgs.check_prefill", "ServerArgs.check_decode"])
def test_a_cuda_major_read_into_a_local_is_the_cuda_version(scan, function):
    (gate,) = [g for g in gates_of(scan, "srt/cuda_major.py") if g["function"] == function]
    (atom,) = [c["atom"] for c in gate["condition"]["args"] if (c.get("atom") or {}).get("kind") == "cuda"]
    assert atom["subject"] == "major" and atom["value"] in ([13], [12])

    def status(gpu, cuda):
        return next(g for g in judge(scan, gpu, cuda).gates if g["id"] == gate["id"])["status"]
    assert status("12.0", "13.0") == "open"  # CUDA 13.0: the refusal never fires on this host
    assert status("12.0", "12.8") == "blocked"  # 12.8 is major 12 (not (12, 8) against (12,))
    assert status("12.0", "12.0") == "blocked"
    assert status("9.0", "12.8") == "open"  # below SM100 the refusal is not for it


def test_a_module_flag_turned_off_below_cuda_13_by_a_version_tuple_needs_cuda_below_13(scan):
    (gate,) = [g for g in gates_of(scan, "srt/tinygemm.py") if g["function"] == "TinyGemmLinear.__init__"]

    def status(gpu, cuda):
        return next(g for g in judge(scan, gpu, cuda).gates if g["id"] == gate["id"])["status"]
    assert status("12.0", "13.0") == "blocked"  # CUDA 13: `get_cuda_version()[0] < 13` turns it off
    assert status("12.0", "12.8") == "open"  # major 12, not (12, 8) against 13
    assert status("9.0", "12.8") == "open"
    assert status("8.0", "12.8") == "blocked"  # the flag's own GPU test still holds


def test_a_class_attribute_naming_a_module_constant_is_read_unless_a_subclass_sets_its_own(scan):
    by_function = {g["function"]: g for g in judged(scan, "srt/class_table.py")}
    h3 = by_function["H3Resolver.resolve"]
    assert h3["status"] == "blocked" and h3["admits"] == ["sm80", "sm90", "sm100", "sm103"]
    assert by_function["BaseResolver.resolve"]["status"] == "unknown"  # OtherResolver's differs


def test_a_try_import_whose_except_falls_back_is_a_requirement(scan):
    gate = next(g for g in judged(scan, "srt/requirements.py") if g["function"] == "resolve")
    assert (gate["status"], gate["shape"]) == ("open", "requirements")


def test_a_branch_inside_an_enclosing_test_the_gpu_fails_is_blocked_not_open(scan):
    inner = next(g for g in judged(scan, "srt/nested_branch.py") if g["condition"] == "major >= 9")
    assert inner["capability"] == "open"  # 12 >= 9, read on its own
    assert inner["status"] == "blocked" and "major == 9" in inner["unreachable"]
    assert next(g for g in judged(scan, "srt/nested_branch.py", "9.0") if g["id"] == inner["id"])["status"] == "open"


def test_a_sail_runtime_branch_is_not_applicable(scan):
    (gate,) = [g for g in judged(scan, "srt/sail.py") if g["kind"] == "guard"]
    assert gate["status"] == "not_applicable" and "is_sail_runtime" in gate["reason"]


# -- issue 43, fix 3 (0.5.20 subblock_sage_fp8_sm90.py:160): a kernel module's refusal of every GPU
# but the one it is written for, reached only through a GPU-named wrapper that a dispatcher hands
# out under a test of that GPU. A module of its own, so the counts above stay those of FILES.
DISPATCH_FILES = {
    "kernels/sage_sm90.py": """
        import torch

        def sage_attention_sm90(q):
            if torch.cuda.get_device_capability(q.device) != (9, 0):
                raise ValueError("This Sage FP8 implementation requires SM90.")
            return q

        __all__ = ["sage_attention_sm90"]
        """,
    "kernels/attn_sm100.py": """
        import torch

        def attention_sm100(q):
            if torch.cuda.get_device_capability(q.device) != (10, 0):
                raise ValueError("This implementation requires SM100.")
            return q
        """,
    "srt/dispatch.py": """
        import torch

        def _sage_sm90(q):
            from sglang.kernels.sage_sm90 import sage_attention_sm90
            return sage_attention_sm90(q)

        def _attention_sm100(q):
            from sglang.kernels.attn_sm100 import attention_sm100
            return attention_sm100(q)

        def runner(device, mode):
            capability = torch.cuda.get_device_capability(device)
            if capability == (9, 0):
                if mode == "sage_fp8":
                    return _sage_sm90
            if capability == (12, 0):
                return _sm120_attention
            return _attention_sm100
        """,
}


@pytest.fixture(scope="module")
def dispatch_scan(tmp_path_factory):
    return scan_files(tmp_path_factory.mktemp("dispatch"), DISPATCH_FILES)


def test_a_kernel_a_dispatcher_hands_only_to_another_gpu_is_not_reached(dispatch_scan):
    (sage,) = judged(dispatch_scan, "kernels/sage_sm90.py")
    assert (sage["capability"], sage["status"]) == ("blocked", "open")
    assert "every caller is closed on sm120" in sage["unreachable"]
    assert "_sage_sm90" in sage["unreachable"] and "capability == (9, 0)" in sage["unreachable"]
    on_sm90 = next(g for g in judged(dispatch_scan, "kernels/sage_sm90.py", "9.0") if g["id"] == sage["id"])
    assert on_sm90["status"] == "open" and on_sm90["unreachable"] is None
    # handed out with no test of the GPU around the return: sm120 may reach it, and it refuses sm120
    (sm100,) = judged(dispatch_scan, "kernels/attn_sm100.py")
    assert (sm100["status"], sm100["unreachable"]) == ("blocked", None)


# -- issue 43, fix 6 (0.5.17 server_args.py:7756, independent-9's false open): `supported` is false on
# sm120 (DeepGEMM's UE8M0 scales are sm100's, the opt-in sm90's), and the body of `if not supported
# and explicit:` only logs that the feature is turned off: the GPU that passes is the one refused. The
# switch itself (`if not supported: envs.X.set(False)`) stays a branch: the accuracy corpus labels
# 0.5.19's (serving_hook.py:449) open on sm120, independent-8's reader blocked. A module of its own,
# so the counts above stay those of FILES.
OFF_FILES = {
    "srt/layers/deep_gemm_wrapper/__init__.py": "from .configurer import *\n",
    "srt/layers/deep_gemm_wrapper/configurer.py": """
        from sglang.srt.utils import get_device_sm, is_sm100_supported

        def _compute_enable_deep_gemm():
            if get_device_sm() < 90:
                return False
            return envs.SGLANG_ENABLE_JIT_DEEPGEMM.get()

        ENABLE_JIT_DEEPGEMM = _compute_enable_deep_gemm()
        DEEPGEMM_SCALE_UE8M0 = ENABLE_JIT_DEEPGEMM and is_sm100_supported()
        """,
    "srt/switch_off.py": """
        import torch
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported, is_sm120_supported

        class ServerArgs:
            def _handle_fp8_wo_gemm(self):
                from sglang.srt.layers import deep_gemm_wrapper

                explicit = envs.SGLANG_OPT_FP8_WO_A_GEMM.is_set()
                supported = deep_gemm_wrapper.DEEPGEMM_SCALE_UE8M0 or (
                    deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM and is_sm90_supported() and explicit
                )
                if not supported and explicit:
                    logger.warning("Disabling SGLANG_OPT_FP8_WO_A_GEMM: requires DeepGEMM JIT and sm100+")
                if not supported:
                    envs.SGLANG_OPT_FP8_WO_A_GEMM.set(False)

            def _handle_overlap(self):
                if not is_sm100_supported():
                    self.enable_two_batch_overlap = False

            def _handle_named(self):
                if is_sm120_supported():
                    logger.info("Using the SM120 grouped GEMM")


        _UNTUNED_WARNED = set()

        def tile_config():
            cap = torch.cuda.get_device_capability()
            if cap not in _UNTUNED_WARNED:
                _UNTUNED_WARNED.add(cap)
                logger.warning("no tuned tile for sm_%d%d; falling back to the default", cap[0], cap[1])
            return DEFAULT_TILE
        """,
}


@pytest.fixture(scope="module")
def off_scan(tmp_path_factory):
    return scan_files(tmp_path_factory.mktemp("switch_off"), OFF_FILES)


def test_a_body_that_only_logs_turning_the_path_off_refuses_the_gpu_that_passes(off_scan):
    (gate,) = [g for g in off_scan.gates if g["function"] == "ServerArgs._handle_fp8_wo_gemm"
               and g["text"] == "not supported and explicit"]
    assert (gate["kind"], gate["polarity"], gate["effect"].get("shape")) == ("guard", -1, "warns")

    def status(gpu):
        return next(g for g in judge(off_scan, gpu, "13.0").gates if g["id"] == gate["id"])["status"]
    assert status("12.0") == "blocked"  # sm120 has neither the UE8M0 scales nor sm100: turned off
    assert status("10.0") == "open"


@pytest.mark.parametrize("function, condition", [
    ("ServerArgs._handle_named", "is_sm120_supported()"),  # a log that only names sm120's choice refuses nothing
    ("tile_config", "cap not in _UNTUNED_WARNED"),  # a warn-once memo (0.5.23 triton_sparse_mla_prefill.py:352)
    ("ServerArgs._handle_fp8_wo_gemm", "not supported"),  # the switch itself: the corpus's label, above
    ("ServerArgs._handle_overlap", "not is_sm100_supported()"),
])
def test_a_body_that_names_a_choice_or_does_the_switching_is_a_branch(off_scan, function, condition):
    (gate,) = [g for g in off_scan.gates if g["function"] == function and g["text"] == condition]
    assert (gate["kind"], gate["polarity"]) == ("if", 1) and "shape" not in gate["effect"]
