"""A GPU that skips a path meant for older or other GPUs loses nothing (issue 43): a branch whose own
test shuts sm120 out is `open` when the code shows it serves only GPUs older than a threshold below
sm120, only the GPUs outside a predicate that admits sm120 (which take the other branch), or only
adjusts a value for other GPUs; the reverse (sm120 falls to the legacy or generic path) stays
`blocked`, and inspect's count line calls only the losses blocked. The scanner runs as on a host (a
subprocess with python3) on one small package; the judging is gpuops' own."""

from __future__ import annotations

import pytest

from gpuops.facts.collect import HostInspection, host_json
from gpuops.facts.host import host_facts
from gpuops.gates.evaluate import GateCounts, judge
from gpuops.gates.report import gate_count_line
from gpuops.transport.parallel import HostOutcome
from test_gate_scanner_snippets import scan_files

FILES = {
    # -- the snippet: a threshold below sm120, and a quirk of another architecture
    "srt/issue.py": """
        import torch
        from sglang.srt.utils import is_sm100_supported

        def tile_config(scale):
            major, _ = torch.cuda.get_device_capability()
            if major < 9:
                cfg = LEGACY_CONFIG
            else:
                cfg = HOPPER_PLUS_CONFIG
            if is_sm100_supported():
                scale = scale * SM100_FIX
            return cfg, scale
        """,
    # -- older GPUs only: thresholds below sm120
    "srt/older.py": """
        import torch

        def moe_backend():
            if (8, 0) <= torch.cuda.get_device_capability() < (10, 0):
                return "marlin"
            return "flashinfer_trtllm"

        def dtype():
            if torch.cuda.get_device_capability()[0] < 8:
                logger.info("Compute capability below sm80: float16")
                return "float16"
            return "bfloat16"

        def warps(num_warps):
            major, _ = torch.cuda.get_device_capability()
            is_sm80_before = major < 8
            if is_sm80_before:
                num_warps = min(num_warps, 8)
            elif major >= 9:
                num_warps = 4
            return num_warps
        """,
    # -- the reverse: sm120 falls to the legacy or generic path
    "srt/reverse.py": """
        import torch
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported

        def attention():
            return "fa3" if is_sm90_supported() or is_sm100_supported() else "triton"

        def tiles():
            major, _ = torch.cuda.get_device_capability()
            if 9 <= major < 12:
                cfg = NEW_CONFIG
            else:
                cfg = LEGACY_CONFIG
            return cfg

        def kernel():
            major, _ = torch.cuda.get_device_capability()
            if major < 12:
                return "cutlass_sm90"
            return "triton"
        """,
    # -- others: the negation of a predicate that admits sm120, with that predicate's own branch
    "srt/others.py": """
        import torch
        from sglang.srt.utils import is_sm100_supported, is_sm120_supported

        def prefill_backend():
            if not (is_sm100_supported() or is_sm120_supported()):
                backend = "fa3"
            else:
                backend = "flashinfer"
            return backend

        def scale_layout():
            major, _ = torch.cuda.get_device_capability()
            if major != 12:
                layout = "swizzled"
            else:
                layout = "linear"
            return layout

        def register():
            if not is_sm120_supported():
                register_fake_quant()
        """,
    # -- after the score of part independent-5 (tuning): negations read through a local alias and in
    # `A if test else B`; a sibling of sm120's own; another GPU's default; a branch that only imports
    "srt/tuned.py": """
        import torch
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported, is_sm120_supported, get_device_sm

        def a_scale(input_scale, rows, channelwise_cutlass, use_cutlass):
            native_scalar_a_scale = use_cutlass and (is_sm90_supported() or is_sm120_supported())
            if channelwise_cutlass and not native_scalar_a_scale:
                x_scale = input_scale.repeat(rows)
            else:
                x_scale = input_scale
            return x_scale

        def decode_backend(self):
            return self.fa3 if not (is_sm100_supported() or is_sm120_supported()) else self.triton

        def tiles():
            major, _ = torch.cuda.get_device_capability()
            if major == 9:
                cfg = HOPPER_CFG
            elif major >= 10:
                cfg = BLACKWELL_CFG
            else:
                cfg = BASELINE
            return cfg

        def olmo_backend(server_args):
            if is_sm100_supported():
                server_args.attention_backend = "trtllm_mha"
            elif get_device_sm() >= 80:
                server_args.attention_backend = "fa3"
            else:
                server_args.attention_backend = "triton"

        def model_defaults(server_args, cfg):
            if is_sm100_supported() and server_args.attention_backend is None:
                server_args.attention_backend = "triton"
            if is_sm100_supported() and cfg.moe_runner_backend == "auto":
                return {"moe_runner_backend": "flashinfer_trtllm"}
            if is_sm100_supported() and server_args.kv_cache_dtype is None:
                server_args.moe_runner_backend = "flashinfer_trtllm"
            return {}

        if is_sm120_supported():
            # this GPU's own kernels, beside the SM90 one
            from flashinfer import mm_mxfp8

        if is_sm90_supported():
            # the SM90 kernel, for the dispatch below
            from flashinfer.gemm import fp8_blockscale_gemm_sm90
        """,
    # -- issue 43, fix 15: the module's only specialised kernel imported for sm100 alone (0.5.2
    # fp8_utils.py:136): no import beside it admits sm120, which is left the generic GEMM
    "srt/fix15_imports.py": """
        from sglang.srt.utils import get_bool_env_var, is_sm100_supported

        ENABLE_FLASHINFER_GEMM = get_bool_env_var("SGLANG_ENABLE_FLASHINFER_GEMM") and is_sm100_supported()
        if ENABLE_FLASHINFER_GEMM:
            from flashinfer.gemm import gemm_fp8_nt_groupwise
        """,
    # -- independent-5's last four shapes: a value true for a band of older GPUs only (and the reverse:
    # a value withheld from some GPUs), an early-return sequence, an `else` only newer GPUs reach
    "srt/fp8_utils.py": """
        import torch

        def can_auto_enable_marlin_fp8():
            try:
                major, minor = torch.cuda.get_device_capability()
                sm = major * 10 + minor
                return 80 <= sm < 89
            except Exception:
                return False
        """,
    "srt/values.py": """
        import torch
        from sglang.srt.fp8_utils import can_auto_enable_marlin_fp8
        from sglang.srt.utils import is_sm100_supported, is_sm120_supported

        class Fp8LinearMethod:
            def __init__(self, force_marlin):
                auto_enable = can_auto_enable_marlin_fp8()
                self.use_marlin = force_marlin or auto_enable

        def overlap_enabled(sbo):
            return sbo and not (is_sm100_supported() or is_sm120_supported())

        def use_legacy_tiles():
            use_legacy = torch.cuda.get_device_capability()[0] < 9
            return use_legacy
        """,
    "srt/early_return.py": """
        import torch

        def arch_key():
            major, _ = torch.cuda.get_device_capability()
            if major == 8:
                return "ampere"
            if major == 9:
                return "hopper"
            if major >= 10:
                return "blackwell"
            return "ampere"

        def mma_kind():
            major, _ = torch.cuda.get_device_capability()
            if major == 10:
                return "tcgen05"
            if major >= 8:
                return "mma"
            return "fma"
        """,
    "srt/newer_else.py": """
        import torch

        def _arch():
            major, minor = torch.cuda.get_device_capability()
            return f"sm{major}{minor}"

        def sparse_attn(q):
            arch = _arch()
            if arch in ("sm80", "sm86", "sm87"):
                out = sparse_attn_f16(q)
            else:
                if arch == "sm90":
                    out = sparse_attn_sm90(q)
                else:
                    out = sparse_attn_fp8(q)
            return out

        def sparse_attn_flat(q):
            arch = _arch()
            if arch == "sm90":
                out = sparse_attn_sm90(q)
            else:
                out = sparse_attn_generic(q)
            return out

        def sparse_attn_not_sm100(q):
            arch = _arch()
            if arch != "sm100":
                if arch == "sm90":
                    out = sparse_attn_sm90(q)
                else:
                    out = sparse_attn_generic(q)
                return out
            return sparse_attn_sm100(q)
        """,
    # -- a quirk is only an adjustment; work or a selection for another GPU is a loss
    "srt/quirk.py": """
        from sglang.srt.utils import is_sm100_supported

        def k_scale(k_scale, out):
            if is_sm100_supported() and k_scale != 1.0:
                k_scale *= E2M1_MAX
            if is_sm100_supported():
                out = fused_norm(out)
            if is_sm100_supported():
                backend = "trtllm"
            if is_sm100_supported():
                k_scale = k_scale * 2
            else:
                k_scale = 0.0
            return k_scale, out
        """,
    # -- a catalogued feature's gate: what the GPU skips there is the feature
    "srt/fusion.py": """
        import torch

        class ServerArgs:
            def auto_enable(self):
                if torch.cuda.get_device_capability()[0] < 10:
                    self.enable_flashinfer_allreduce_fusion = True
        """,
}


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    return scan_files(tmp_path_factory.mktemp("skips"), FILES)


def judged(scan, file, gpu="12.0"):
    return judge(scan, gpu, "13.0").gates


def gate(scan, file, text, gpu="12.0"):
    """The one gate of ``file`` whose condition is ``text`` (else the one that contains it)."""
    mine = [g for g in judge(scan, gpu, "13.0").gates if g["file"] == file]
    found = [g for g in mine if g["condition"] == text] or [g for g in mine if text in g["condition"]]
    assert len(found) == 1, [g["condition"] for g in mine]
    return found[0]


@pytest.mark.parametrize("file, text, kind", [
    ("srt/issue.py", "major < 9", "older"),
    ("srt/issue.py", "is_sm100_supported()", "quirk"),
    # a floor at Ampere is where SGLang's paths start, not a band chosen over the oldest GPUs
    ("srt/older.py", "(8, 0) <=", "older"),
    # no candidate admitted, an older GPU (sm75) is
    ("srt/older.py", "[0] < 8", "older"),
    # through a local alias; its sibling `elif major >= 9` serves sm120
    ("srt/older.py", "is_sm80_before", "older"),
    ("srt/others.py", "not (is_sm100_supported() or is_sm120_supported())", "others"),
    ("srt/others.py", "major != 12", "others"),
    ("srt/quirk.py", "k_scale != 1.0", "quirk"),
    # tuning, after independent-5's score:
    ("srt/tuned.py", "channelwise_cutlass and not native_scalar_a_scale", "others"),  # through the alias
    ("srt/tuned.py", "not (is_sm100_supported() or is_sm120_supported())", "others"),  # `A if test else B`
    ("srt/tuned.py", "major == 9", "own_branch"),  # `elif major >= 10:` is sm120's own
    ("srt/tuned.py", "is_sm100_supported() and server_args.attention_backend is None", "default"),
    ("srt/tuned.py", "is_sm90_supported()", "imports"),
])
def test_a_branch_for_older_or_other_gpus_costs_sm120_nothing(scan, file, text, kind):
    got = gate(scan, file, text)
    assert got["capability"] == "blocked"  # its own test shuts sm120 out ...
    assert (got["status"], got.get("skips")) == ("open", kind), got["reason"]  # ... and sm120 loses nothing
    assert "sm120" in got["reason"]


@pytest.mark.parametrize("file, text", [
    ("srt/reverse.py", "is_sm90_supported() or is_sm100_supported()"),  # fa3 for them, triton for sm120
    ("srt/reverse.py", "9 <= major < 12"),  # a band that leaves out the oldest: sm120 gets the legacy path
    ("srt/reverse.py", "major < 12"),  # the threshold is sm120 itself: written about this GPU
    ("srt/others.py", "not is_sm120_supported()"),  # no branch of sm120's own: it skips the registration
    ("srt/tuned.py", "is_sm100_supported()"),  # its sibling `get_device_sm() >= 80` is the generic path
    # "auto" is the program's pick of the best runner, made for sm100 here (issue 43, fix 13a)
    ("srt/tuned.py", "is_sm100_supported() and cfg.moe_runner_backend == \"auto\""),
    # the only specialised kernel imported, for sm100 alone: nothing of sm120's own beside it (fix 15)
    ("srt/fix15_imports.py", "ENABLE_FLASHINFER_GEMM"),
])
def test_the_reverse_stays_blocked(scan, file, text):
    got = gate(scan, file, text)
    assert (got["status"], got.get("skips")) == ("blocked", None), got["reason"]


@pytest.mark.parametrize("file, text, kind", [
    # a value with no branch, true from sm80 to below sm89 and for no older GPU: a fallback for them
    ("srt/values.py", "can_auto_enable_marlin_fp8()", "older"),
    ("srt/values.py", "force_marlin or auto_enable", "older"),  # through the local alias
    # `if major == 9: return` then `if major >= 10: return`: an early-return sequence is a chain
    ("srt/early_return.py", "major == 9", "own_branch"),
    # the `else` sm120 takes, which sm80..sm87 never reach (the enclosing test takes them)
    ("srt/newer_else.py", "arch == \"sm90\"", "own_branch"),
])
def test_independent_5s_shapes_cost_sm120_nothing(scan, file, text, kind):
    mine = [g for g in judge(scan, "12.0", "13.0").gates if g["file"] == file and g["condition"] == text
            and g["function"] in ("Fp8LinearMethod.__init__", "arch_key", "sparse_attn")]
    assert len(mine) == 1, [(g["function"], g["condition"]) for g in mine]
    got = mine[0]
    assert got["capability"] == "blocked"
    assert (got["status"], got.get("skips")) == ("open", kind), got["reason"]
    assert "sm120" in got["reason"]


@pytest.mark.parametrize("file, function, text", [
    # every GPU but Blackwell's, sm75 too: the overlap withheld from sm120, not a fallback
    ("srt/values.py", "overlap_enabled", "sbo and not (is_sm100_supported() or is_sm120_supported())"),
    # no lower end: a value true for every GPU older than sm90 says nothing of what sm120 gets instead
    ("srt/values.py", "use_legacy_tiles", "torch.cuda.get_device_capability()[0] < 9"),
    # the sequence's next test admits sm80 too: the generic path, sm120 loses tcgen05
    ("srt/early_return.py", "mma_kind", "major == 10"),
    # no enclosing test: sm80 takes the `else` too, the generic path
    ("srt/newer_else.py", "sparse_attn_flat", "arch == \"sm90\""),
    # the enclosing test leaves out sm100, not the oldest: the `else` is still the generic path
    ("srt/newer_else.py", "sparse_attn_not_sm100", "arch == \"sm90\""),
])
def test_independent_5s_reverse_stays_blocked(scan, file, function, text):
    (got,) = [g for g in judge(scan, "12.0", "13.0").gates if g["file"] == file
              and g["function"] == function and g["condition"] == text]
    assert (got["status"], got.get("skips")) == ("blocked", None), got["reason"]


def test_a_default_is_only_what_the_test_requires_unset(scan):
    # `kv_cache_dtype is None` tested, `moe_runner_backend` set: a choice for sm100, not a default of it
    got = gate(scan, "srt/tuned.py", "is_sm100_supported() and server_args.kv_cache_dtype is None")
    assert (got["status"], got.get("skips")) == ("blocked", None)


def test_work_or_a_selection_for_another_gpu_is_a_loss(scan):
    gates = [g for g in judged(scan, "srt/quirk.py") if g["file"] == "srt/quirk.py"]
    by_line = {g["line"]: g for g in gates}
    assert [(line, by_line[line]["status"], by_line[line].get("skips")) for line in sorted(by_line)] == [
        (5, "open", "quirk"),  # k_scale *= E2M1_MAX
        (7, "blocked", None),  # out = fused_norm(out): sm100 gets a kernel sm120 does not
        (9, "blocked", None),  # backend = "trtllm": a selection
        (11, "blocked", None),  # k_scale = k_scale * 2, but an else sets it otherwise: a selection
    ]


def test_the_threshold_is_read_for_the_gpu_judged(scan):
    # sm80 passes `major < 9`; sm90's threshold is sm90 itself (not below it): blocked, as before.
    assert gate(scan, "srt/issue.py", "major < 9", "8.0")["status"] == "open"
    on_sm90 = gate(scan, "srt/issue.py", "major < 9", "9.0")
    assert (on_sm90["status"], on_sm90.get("skips")) == ("blocked", None)
    assert gate(scan, "srt/older.py", "(8, 0) <=", "10.0")["status"] == "blocked"
    assert gate(scan, "srt/older.py", "(8, 0) <=", "10.3").get("skips") == "older"


def test_a_catalogued_features_gate_is_not_read_so(scan):
    got = gate(scan, "srt/fusion.py", "[0] < 10")
    assert got["feature"] == "flashinfer_allreduce_fusion" and got["role"] == "auto_enable"
    assert (got["status"], got.get("skips")) == ("blocked", None)


def test_the_count_line_calls_only_the_losses_blocked(scan):
    report = judge(scan, "12.0", "13.0")
    counts = report.counts()
    gates = report.gates
    losses = [g for g in gates if g["status"] == "blocked" and not g["unreachable"]]
    skipped = [g for g in gates if g.get("skips")]
    assert counts == GateCounts(
        total=len(gates), blocked=len(losses),
        not_reached=sum(1 for g in gates if g["status"] == "blocked" and g["unreachable"]),
        open=sum(1 for g in gates if g["status"] == "open"), skips=len(skipped),
        unknown=sum(1 for g in gates if g["status"] == "unknown"),
        not_applicable=sum(1 for g in gates if g["status"] == "not_applicable"))
    assert len(skipped) == 20 and all(g["status"] == "open" for g in skipped)
    line = gate_count_line(report)
    assert f"{counts.blocked} blocked (sm120 loses something there)" in line
    assert f"{counts.open} open (20 skip a path for older or other GPUs)" in line
    assert counts.to_json()["skips"] == 20 and sum(
        v for k, v in counts.to_json().items() if k not in ("total", "skips")) == counts.total


def test_inspect_json_carries_the_counts(scan):
    # `gate_counts` in a host's entry of `inspect host --json` is the count line's, null without a report
    report = judge(scan, "12.0", "13.0")
    entry = host_json(HostOutcome(ok=True, value=HostInspection(facts=host_facts({}), gate_report=report)))
    assert entry["gate_counts"] == report.counts().to_json() and entry["gate_counts"]["skips"] == 20
    unjudged = host_json(HostOutcome(ok=True, value=HostInspection(facts=host_facts({}), gates_error="no python")))
    assert unjudged["gate_counts"] is None
    assert host_json(HostOutcome(ok=False, error="refused"))["gate_counts"] is None


# -- fix 3 (after part independent-6): a conditional expression that only adds a suffix to the
# architecture list for another architecture. A module of its own, so the counts above stay those of FILES.
FLAG_FILES = {
    "srt/jit_flags.py": """
        import torch

        def build():
            major, minor = torch.cuda.get_device_capability()
            fast = (major, minor) == (9, 0)
            return load_jit("quant", extra_cuda_cflags=["--use_fast_math"] if fast else [])

        def arch_list():
            capability = torch.cuda.get_device_capability()
            arch = f"{capability[0]}.{capability[1]}"
            return f"{arch}{'+PTX' if arch == '9.0' else ''}"

        def defines():
            major, minor = torch.cuda.get_device_capability()
            return load_jit("quant", extra_cuda_cflags=["-DENABLE_SM100_FP8"] if major == 10 else [])

        def kernel_name():
            major, minor = torch.cuda.get_device_capability()
            return "quant_sm90" if (major, minor) == (9, 0) else ""
        """,
}


@pytest.fixture(scope="module")
def flag_scan(tmp_path_factory):
    return scan_files(tmp_path_factory.mktemp("flags"), FLAG_FILES)


def _in(scan, function):
    """The gate of ``function``'s conditional expression (in ``build`` the alias's own assignment is
    a gate too: the last one is the use)."""
    return max((g for g in judge(scan, "12.0", "13.0").gates if g["function"] == function), key=lambda g: g["line"])


def test_an_architecture_list_suffix_for_another_architecture_costs_sm120_nothing(flag_scan):
    got = _in(flag_scan, "arch_list")
    assert got["capability"] == "blocked"
    assert (got["status"], got.get("skips")) == ("open", "quirk"), got["reason"]
    assert "`+PTX` to the architecture list" in got["reason"] and "sm120" in got["reason"]


@pytest.mark.parametrize("function", [
    "defines",  # a -D macro turns on code in the kernel: a path sm120 does not get
    "kernel_name",  # a value, not an option: another kernel
])
def test_a_macro_or_a_value_for_another_architecture_stays_blocked(flag_scan, function):
    got = _in(flag_scan, function)
    assert (got["status"], got.get("skips")) == ("blocked", None), got["reason"]


# -- fix 3: an `else` behind a refusal earlier in the function (0.5.20 platforms/cuda.py:465)
GUARDED_FILES = {
    "srt/guarded.py": """
        import torch

        SUPPORTED = ((9, 0), (10, 0), (12, 0))

        def load_sparse_kernel():
            capability = torch.cuda.get_device_capability()
            if capability not in SUPPORTED:
                raise ValueError("needs compute capability 9.0, 10.0 or 12.0")
            if capability == (9, 0):
                load_sm90()
            elif capability == (10, 0):
                load_sm100()
            else:
                load_sm120()

        def load_dense_kernel():
            capability = torch.cuda.get_device_capability()
            if capability < (8, 0):
                raise ValueError("needs compute capability 8.0 or newer")
            if capability == (9, 0):
                load_sm90()
            elif capability == (10, 0):
                load_sm100()
            else:
                load_generic()
        """,
}


@pytest.fixture(scope="module")
def guarded_scan(tmp_path_factory):
    return scan_files(tmp_path_factory.mktemp("guarded"), GUARDED_FILES)


def test_an_else_only_the_gpus_generation_reaches_behind_a_refusal_is_its_own(guarded_scan):
    (got,) = [g for g in judge(guarded_scan, "12.0", "13.0").gates
              if g["function"] == "load_sparse_kernel" and g["condition"] == "capability == (10, 0)"]
    assert got["capability"] == "blocked"
    assert (got["status"], got.get("skips")) == ("open", "own_branch"), got["reason"]
    assert "only sm120 reach" in got["reason"]


def test_an_else_older_gpus_reach_past_the_refusal_stays_generic(guarded_scan):
    # sm80..sm89 pass `capability < (8, 0)` and take the else too: the generic path, sm120 loses sm100's
    (got,) = [g for g in judge(guarded_scan, "12.0", "13.0").gates
              if g["function"] == "load_dense_kernel" and g["condition"] == "capability == (10, 0)"]
    assert (got["status"], got.get("skips")) == ("blocked", None), got["reason"]


# -- fix 4 (after part independent-7): a compiler math mode picked for one other architecture only
# (0.5.18 causal_conv1d.py:35/36, per_token_quant_fp8.py:35; 0.5.20 per_token_quant_fp8.py:27/35):
# sm90's build matched, sm120 builds the same kernel as every other GPU. Two blind readers read it so;
# independent-5's read 0.5.21's identical line blocked, which samples.json now keeps as open|blocked.
MATH_FILES = {
    "srt/jit_math.py": """
        import torch

        def build_module():
            major, minor = torch.cuda.get_device_capability()
            use_fast_math = (major, minor) == (9, 0)
            math_mode = "fast_math" if use_fast_math else "precise_math"
            return load_jit("quant", math_mode, extra_cuda_cflags=["--use_fast_math"] if use_fast_math else [])

        def build_all_but_sm120():
            major, minor = torch.cuda.get_device_capability()
            fast = major != 12
            return load_jit("quant", extra_cuda_cflags=["--use_fast_math"] if fast else [])

        def build_and_pick():
            major, minor = torch.cuda.get_device_capability()
            hopper = (major, minor) == (9, 0)
            mode = "fast_math" if hopper else "precise_math"
            return load_jit("quant", mode, kernel="wgmma" if hopper else "mma")
        """,
}


@pytest.fixture(scope="module")
def math_scan(tmp_path_factory):
    return scan_files(tmp_path_factory.mktemp("math"), MATH_FILES)


def test_a_math_mode_for_another_architecture_costs_sm120_nothing(math_scan):
    gates = [g for g in judge(math_scan, "12.0", "13.0").gates if g["function"] == "build_module"]
    # the switch's assignment, the math_mode choice, the --use_fast_math option
    assert len(gates) == 3, [g["condition"] for g in gates]
    for got in gates:
        assert got["capability"] == "blocked"
        assert (got["status"], got.get("skips")) == ("open", "quirk"), (got["line"], got["reason"])
        assert "math mode" in got["reason"] and "for sm90;" in got["reason"]


@pytest.mark.parametrize("function", [
    "build_all_but_sm120",  # every generation but sm120's gets it: written about sm120, not for one other
    "build_and_pick",  # the switch picks a kernel too: a path sm120 does not get
])
def test_a_math_mode_for_several_generations_or_a_switch_read_otherwise_stays_blocked(math_scan, function):
    gates = [g for g in judge(math_scan, "12.0", "13.0").gates
             if g["function"] == function and g["kind"] == "assign"]
    assert gates and all((g["status"], g.get("skips")) == ("blocked", None) for g in gates), \
        [(g["line"], g["reason"]) for g in gates]


# -- fix 4: a branch sm120 never reaches because an earlier branch of its chain, which admits sm120,
# takes it, whatever that earlier test is (0.5.12 fp4_utils.py:152, platforms/cuda.py:398; 0.5.18
# kvfp4_tensor.py:285, sana_wm_gdn_chunkwise.py:1260): samples.json's convention calls it open.
TAKEN_FILES = {
    "srt/taken.py": """
        import torch
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported, is_sm120_supported

        def fp4_backend(backend):
            if backend == "auto":
                if is_sm120_supported():
                    backend = "flashinfer_cudnn"
                elif is_sm100_supported():
                    backend = "flashinfer_cutedsl"
                else:
                    backend = "flashinfer_cutlass"
            return backend

        def tile():
            major, minor = torch.cuda.get_device_capability()
            if major == 10:
                cfg = (4, 8)
            elif major == 12 and minor == 0:
                cfg = (8, 8)
            elif major == 12 and minor == 1:
                cfg = (1, 1)
            else:
                cfg = (2, 2)
            return cfg

        def dequantize(x):
            if is_sm100_supported() or is_sm120_supported():
                return nvfp4_dequantize(x)
            else:
                assert is_sm90_supported(), "needs SM100/SM120, or SM90 for the fallback"
                return torch_fallback(x)

        def older_catches():
            if is_sm90_supported():
                backend = "sm90"
            elif is_sm100_supported():
                backend = "sm100"
            return backend

        def attention_backend():
            if is_sm120_supported():
                backend = "torch_sdpa"
            elif is_sm100_supported():
                set_fa_ver(4)
                backend = "fa"
            return backend
        """,
}


@pytest.fixture(scope="module")
def taken_scan(tmp_path_factory):
    return scan_files(tmp_path_factory.mktemp("taken"), TAKEN_FILES)


@pytest.mark.parametrize("function, condition, earlier", [
    ("fp4_backend", "is_sm100_supported()", "is_sm120_supported()"),
    ("tile", "major == 12 and minor == 1", "major == 12 and minor == 0"),
    ("dequantize", "is_sm90_supported()", "is_sm100_supported() or is_sm120_supported()"),
])
def test_a_branch_an_earlier_branch_for_sm120_takes_it_from_costs_nothing(taken_scan, function, condition, earlier):
    (got,) = [g for g in judge(taken_scan, "12.0", "13.0").gates
              if g["function"] == function and g["condition"] == condition]
    assert got["capability"] == "blocked"
    assert (got["status"], got.get("skips")) == ("open", "taken_before"), got["reason"]
    assert f"(`{earlier}`)" in got["reason"]


@pytest.mark.parametrize("function", [
    "older_catches",  # sm120 fails is_sm90_supported() too: it reaches the elif and loses sm100's path
    # the elif does work (turns FA4 on), not only select a value: 0.5.8's blind readers call the FA4
    # sm120 never gets there a loss (platforms/cuda.py:264, :281)
    "attention_backend",
])
def test_a_later_branch_sm120_reaches_or_that_does_work_stays_blocked(taken_scan, function):
    (got,) = [g for g in judge(taken_scan, "12.0", "13.0").gates
              if g["function"] == function and g["condition"] == "is_sm100_supported()"]
    assert (got["status"], got.get("skips")) == ("blocked", None), got["reason"]


# -- fixes 7-10 (after part independent-9): branches for another architecture that cost sm120
# nothing, read from what the body does. A module of its own, so the counts above stay those of FILES.
NINE_FILES = {
    "srt/nine.py": """
        import torch
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported, is_sm120_supported

        _is_sm100 = is_sm100_supported()
        _is_sm90 = is_sm90_supported()

        # fix 7 (0.5.17 fp8_utils.py:245): the elif only returns a value, calling nothing, and the
        # earlier `major >= 9` catches sm120
        def cutlass_fp8_supported():
            major, minor = torch.cuda.get_device_capability()
            cuda_version = get_cuda_version()
            if major >= 9:
                return cuda_version >= (12, 0)
            elif major == 8 and minor == 9:
                return cuda_version >= (12, 4)
            return False

        def runner():
            if is_sm120_supported():
                return "sm120"
            elif is_sm100_supported():
                return make_sm100_runner()

        # fix 8 (0.5.17 overrides.py:1229): another GPU's default where none was given, set in the
        # overrides dict
        def nemotron_overrides(server_args):
            overrides = {}
            if is_sm100_supported() and server_args.attention_backend is None:
                overrides["attention_backend"] = "flashinfer"
            if is_sm100_supported() and server_args.moe_runner_backend == "auto":
                overrides["quantization"] = "modelopt_fp4"
                overrides["moe_runner_backend"] = "flashinfer_trtllm"
            return overrides

        def llama_overrides(server_args):
            overrides = {}
            if is_sm100_supported() and server_args.moe_runner_backend == "auto":
                overrides["moe_runner_backend"] = "flashinfer_trtllm"
            return overrides

        # fix 9 (0.5.9 mxfp4.py:327): only sizes rounded up to what sm100's kernels lay out
        def create_weights(self, intermediate_size, hidden_size):
            intermediate_after_pad = intermediate_size
            if _is_sm100:
                if self.use_flashinfer:
                    intermediate_after_pad = round_up(intermediate_size, 256)
                    hidden_size = round_up(hidden_size, 256)
                else:
                    intermediate_after_pad = round_up(intermediate_size, 64)
            elif has_triton_kernels:
                intermediate_after_pad = round_up(intermediate_size, 32)
            return intermediate_after_pad, hidden_size

        def create_fused_weights(self, hidden_size):
            if _is_sm100:
                hidden_size = round_up(hidden_size, 256)
                self.w13 = shuffle_for_trtllm(self.w13)
            return hidden_size

        # fix 10 (0.5.9 mxfp4.py:155): each branch hands one setter its own literal settings
        def swizzle(opt_flags):
            if _is_sm100:
                constraints = {"is_persistent": True, "epilogue_subtile": 1}
                opt_flags.update_opt_flags_constraints(constraints)
            elif _is_sm90:
                constraints = {"split_k": 1}
                opt_flags.update_opt_flags_constraints(constraints)
            return opt_flags

        def enable_features(opt_flags):
            if _is_sm100:
                opt_flags.update_opt_flags_constraints({"is_persistent": True})
            elif _is_sm90:
                enable_fast_path(True)
            return opt_flags
        """,
    # fix 11 (0.5.17 single_batch_overlap.py:52, and the same lines of 0.5.12, 0.5.15, 0.5.18, 0.5.20):
    # a value false on Blackwell whose sibling method reads it negated: the two are one choice, and
    # Blackwell GPUs get the other scheme
    "srt/sbo.py": """
        from sglang.srt.utils import is_sm100_supported, is_sm120_supported

        class SboFlags:
            @classmethod
            def enable_combine_shared_two_stream_overlap(cls):
                return is_sbo_enabled() and not cls.enable_dispatch_shared_one_stream_overlap()

            @classmethod
            def enable_dispatch_shared_one_stream_overlap(cls):
                return is_sbo_enabled() and not (is_sm100_supported() or is_sm120_supported())

            @classmethod
            def enable_deep_gemm_overlap(cls):
                return is_sbo_enabled() and not (is_sm100_supported() or is_sm120_supported())
        """,
}


@pytest.fixture(scope="module")
def nine_scan(tmp_path_factory):
    return scan_files(tmp_path_factory.mktemp("nine"), NINE_FILES)


def _nine(scan, function, condition):
    (got,) = [g for g in judge(scan, "12.0", "13.0").gates if g["function"] == function and g["condition"] == condition]
    return got


@pytest.mark.parametrize("function, condition, kind", [
    ("cutlass_fp8_supported", "major == 8 and minor == 9", "taken_before"),
    ("nemotron_overrides", "is_sm100_supported() and server_args.attention_backend is None", "default"),
    ("create_weights", "_is_sm100", "quirk"),
    ("swizzle", "_is_sm90", "quirk"),
    ("swizzle", "_is_sm100", "quirk"),
    ("SboFlags.enable_dispatch_shared_one_stream_overlap",
     "is_sbo_enabled() and not (is_sm100_supported() or is_sm120_supported())", "others"),
])
def test_independent_9s_branches_for_another_architecture_cost_sm120_nothing(nine_scan, function, condition, kind):
    got = _nine(nine_scan, function, condition)
    assert got["capability"] == "blocked"
    assert (got["status"], got.get("skips")) == ("open", kind), got["reason"]
    assert "sm120" in got["reason"]


@pytest.mark.parametrize("function, condition", [
    ("runner", "is_sm100_supported()"),  # the elif returns what a call builds: work, not a value
    # the quantization is set too, which the test does not require unset: a choice for sm100
    ("nemotron_overrides", "is_sm100_supported() and server_args.moe_runner_backend == \"auto\""),
    # a dict's setting against "auto", not None: sm100's MoE runner, which the blind readers call a loss
    ("llama_overrides", "is_sm100_supported() and server_args.moe_runner_backend == \"auto\""),
    ("create_fused_weights", "_is_sm100"),  # pads, and shuffles the weights for trtllm: work
    ("enable_features", "_is_sm100"),  # the sibling turns a fast path on: not one setter's table
    # no other method reads it negated: what Blackwell gets instead the code does not say
    ("SboFlags.enable_deep_gemm_overlap", "is_sbo_enabled() and not (is_sm100_supported() or is_sm120_supported())"),
])
def test_independent_9s_reverse_stays_blocked(nine_scan, function, condition):
    got = _nine(nine_scan, function, condition)
    assert (got["status"], got.get("skips")) == ("blocked", None), got["reason"]


# -- fix 12 (after part independent-10): shapes of independent-10's misses, each read from the code.
# A module of its own, so the counts above stay those of FILES.
TEN_FILES = {
    "srt/ten.py": """
        import torch
        from sglang.srt.utils import is_hip, is_sm100_supported, is_sm120_supported

        CUDA_CAPABILITY = torch.cuda.get_device_capability()

        class ServerArgs:
            # fix 12a (0.5.13 server_args.py:2187, a false open): sm120's own elif only picks the MoE
            # runner the chain's generic branch picks for any GPU; sm100's flashinfer runner is a loss
            def gpt_oss_defaults(self, mxfp4):
                if self.moe_runner_backend == "auto":
                    if is_sm100_supported() and mxfp4:
                        self.moe_runner_backend = "flashinfer_mxfp4"
                    elif is_sm120_supported() and mxfp4:
                        self.moe_runner_backend = "triton_kernel"
                    elif is_hip() and mxfp4:
                        self.moe_runner_backend = "auto"
                    elif self.ep_size == 1 and self.quantization is None:
                        self.moe_runner_backend = "triton_kernel"

            # ... where sm120's elif picks a runner of its own (0.5.15 overrides.py:516: marlin), it is open
            def gpt_oss_overrides(self, mxfp4):
                if self.moe_runner_backend == "auto":
                    if is_sm100_supported() and mxfp4:
                        self.moe_runner_backend = "flashinfer_mxfp4"
                    elif is_sm120_supported() and mxfp4:
                        self.moe_runner_backend = "marlin"
                    elif is_hip() and mxfp4:
                        self.moe_runner_backend = "marlin"
                    elif self.ep_size == 1 and self.quantization is None:
                        self.moe_runner_backend = "triton_kernel"

        # fix 12b (0.5.13 extend_attention.py:75): the elif only picks block sizes (by the head size,
        # under an if/else of its own) and the earlier `== 12` branch catches sm120
        def block_sizes(Lq):
            if CUDA_CAPABILITY[0] == 12:
                if Lq <= 128:
                    BLOCK_M, BLOCK_N = (64, 128)
                else:
                    BLOCK_M, BLOCK_N = (32, 32)
            elif CUDA_CAPABILITY[0] == 10:
                if Lq <= 256:
                    BLOCK_M, BLOCK_N = (64, 64)
                else:
                    BLOCK_M, BLOCK_N = (16, 64)
            else:
                BLOCK_M, BLOCK_N = (64, 64)
            return BLOCK_M, BLOCK_N

        # ... where the nested if picks by what a call answers, it is not only a choice of sizes
        def block_sizes_tuned(Lq):
            if CUDA_CAPABILITY[0] == 12:
                BLOCK_M, BLOCK_N = (32, 32)
            elif CUDA_CAPABILITY[0] == 10:
                if autotune(Lq):
                    BLOCK_M, BLOCK_N = (64, 64)
            return BLOCK_M, BLOCK_N

        # fix 12c (0.5.11 jit_kernel/activation.py:26): the math mode chosen by early returns, precise
        # from sm100 up (sm120 passes), fast math on sm90 only: a choice, not a refusal of the GPUs that pass
        def fast_math_flags():
            if is_hip():
                return []
            if torch.cuda.get_device_capability()[0] >= 10:
                return []
            return ["--use_fast_math"]

        def fast_math_hopper():
            if torch.cuda.get_device_capability() == (9, 0):
                return ["--use_fast_math"]
            return []

        # ... an early `return []` before other options (a -D macro changes the code) is a refusal still
        def arch_flags():
            if torch.cuda.get_device_capability()[0] >= 10:
                return []
            return ["-DHOPPER_ONLY"]

        # fix 12d (0.5.11 sparse_linear_attn.py:555): the branch and its else only give the same names
        # numbers, per-architecture block sizes; sm120 gets the else's as every other GPU does
        def _get_cuda_arch(device_index):
            major, minor = torch.cuda.get_device_capability(device_index)
            return f"sm{major}{minor}"

        def sla_blocks(q):
            arch = _get_cuda_arch(q.device.index)
            if arch == "sm90":
                BLKQ = 64
                BLKK = 128
            else:
                BLKQ = 128
                BLKK = 64
            return BLKQ, BLKK

        # ... a kernel chosen by name is not (0.5.9 vision.py:733: fa3 for Hopper, triton_attn for the rest)
        def vit_backend():
            if torch.cuda.get_device_capability()[0] == 9:
                backend = "fa3"
            else:
                backend = "triton_attn"
            return backend
        """,
}


@pytest.fixture(scope="module")
def ten_scan(tmp_path_factory):
    return scan_files(tmp_path_factory.mktemp("ten"), TEN_FILES)


@pytest.mark.parametrize("function, condition, kind", [
    # the hip branch picks marlin too: another platform's path, not the generic one
    ("ServerArgs.gpt_oss_overrides", "is_sm100_supported() and mxfp4", "own_branch"),
    ("block_sizes", "CUDA_CAPABILITY[0] == 10", "taken_before"),
    ("fast_math_hopper", "torch.cuda.get_device_capability() == (9, 0)", "quirk"),
    ("sla_blocks", 'arch == "sm90"', "quirk"),
])
def test_independent_10s_branches_for_another_architecture_cost_sm120_nothing(ten_scan, function, condition, kind):
    got = _nine(ten_scan, function, condition)
    assert got["capability"] == "blocked"
    assert (got["status"], got.get("skips")) == ("open", kind), got["reason"]


@pytest.mark.parametrize("function, condition", [
    ("ServerArgs.gpt_oss_defaults", "is_sm100_supported() and mxfp4"),
    ("block_sizes_tuned", "CUDA_CAPABILITY[0] == 10"),  # calls autotune(): not only a choice
    ("vit_backend", "torch.cuda.get_device_capability()[0] == 9"),
])
def test_independent_10s_reverse_stays_blocked(ten_scan, function, condition):
    got = _nine(ten_scan, function, condition)
    assert (got["status"], got.get("skips")) == ("blocked", None), got["reason"]


def test_independent_10s_math_mode_by_early_returns_admits_the_gpus_that_pass(ten_scan):
    got = _nine(ten_scan, "fast_math_flags", "torch.cuda.get_device_capability()[0] >= 10")
    assert (got["kind"], got["status"]) == ("if", "open"), got["reason"]
    got = _nine(ten_scan, "arch_flags", "torch.cuda.get_device_capability()[0] >= 10")
    assert got["kind"] == "guard" and got["status"] == "blocked", got["reason"]


# -- fix 13 (after part independent-11): shapes of independent-11's misses, each read from the code.
ELEVEN_FILES = {
    "srt/eleven.py": """
        from sglang.srt.utils import is_sm100_supported

        class ServerArgs:
            # fix 13a (0.5.6 server_args.py:1148, 0.5.7 :1260, 0.5.8 :1367, false opens): sm100's MoE
            # runner where the program picks the best one ("auto"), not a default where none was given
            def llama4_defaults(self):
                if is_sm100_supported() and self.moe_runner_backend == "auto":
                    if self.quantization in {"fp8", "modelopt_fp8"}:
                        self.moe_runner_backend = "flashinfer_trtllm"

            def llama4_attention(self):
                if is_sm100_supported() and self.attention_backend is None:
                    self.attention_backend = "trtllm_mha"

        _is_sm100_supported = is_sm100_supported()

        # fix 13b (0.5.6 and 0.5.7 mxfp4.py:105): a lone if handing one setter sm100's literal settings,
        # a table of one row; 0.5.9 adds sm90's row as an elif (fix 10)
        def swizzle_mxfp4(opt_flags):
            if _is_sm100_supported:
                constraints = {
                    "is_persistent": True,
                    "epilogue_subtile": 1,
                }
                opt_flags.update_opt_flags_constraints(constraints)
            return opt_flags

        def swizzle_and_enable(opt_flags):
            if _is_sm100_supported:
                opt_flags.update_opt_flags_constraints({"is_persistent": True})
                enable_fast_path(True)
            return opt_flags
        """,
    # fix 13c (0.5.6 common.py:511, 0.5.7 common.py:499 and platforms/cuda.py:132): devices picked by
    # a property across architectures (Orin, Thor, Spark: memory shared with the CPU), sm121 among them
    # and not sm120, which takes the else with every other GPU; one sibling alone stays a loss
    "srt/memory.py": """
        import psutil
        import torch
        from sglang.srt.utils import get_device_sm

        def is_sm121():
            return torch.cuda.get_device_capability() == (12, 1)

        def available_memory(gpu_id):
            SHARED_SYSMEM_DEVICE_MEM_SMS = (87, 110, 121)  # Orin, Thor, Spark
            if get_device_sm() in SHARED_SYSMEM_DEVICE_MEM_SMS:
                free_gpu_memory = psutil.virtual_memory().available
            else:
                free_gpu_memory, _ = torch.cuda.mem_get_info(gpu_id)
            return free_gpu_memory

        def stages():
            return {"num_stages": 3 if is_sm121() else 4}
        """,
}


@pytest.fixture(scope="module")
def eleven_scan(tmp_path_factory):
    return scan_files(tmp_path_factory.mktemp("eleven"), ELEVEN_FILES)


@pytest.mark.parametrize("function, condition, kind", [
    ("ServerArgs.llama4_attention", "is_sm100_supported() and self.attention_backend is None", "default"),
    ("swizzle_mxfp4", "_is_sm100_supported", "quirk"),
    ("available_memory", "get_device_sm() in SHARED_SYSMEM_DEVICE_MEM_SMS", "others"),
])
def test_independent_11s_branches_for_another_architecture_cost_sm120_nothing(eleven_scan, function, condition, kind):
    got = _nine(eleven_scan, function, condition)
    assert got["capability"] == "blocked"
    assert (got["status"], got.get("skips")) == ("open", kind), got["reason"]


@pytest.mark.parametrize("function, condition", [
    ("ServerArgs.llama4_defaults", "is_sm100_supported() and self.moe_runner_backend == \"auto\""),
    ("swizzle_and_enable", "_is_sm100_supported"),  # turns a fast path on too: not only settings
    ("stages", "is_sm121()"),  # sm121 alone: the chip sm120 shares may be what the test is about
])
def test_independent_11s_reverse_stays_blocked(eleven_scan, function, condition):
    got = _nine(eleven_scan, function, condition)
    assert (got["status"], got.get("skips")) == ("blocked", None), got["reason"]
