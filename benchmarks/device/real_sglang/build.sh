#!/usr/bin/env bash
# Build what the real-SGLang device run carries (.dev/real-sglang, ~58 MB; under the 64 MiB a call).
# Runs here, on the CPU machine, from PyPI; the GPU machine has no network. Usage, from the repo root:
#   benchmarks/device/real_sglang/build.sh          (then run.sh on the device: see README.md)
# Pins: SGLang 0.5.16 pins torch 2.11.0, the GPU machine's own torch; its kernel, FlashInfer and
# xgrammar at the versions 0.5.16 pins; what sglang imports at launch and that machine lacks.
set -euo pipefail
cd "$(dirname "$0")/../../.."
HERE=benchmarks/device/real_sglang
W=${W:-${TMPDIR:-/tmp}/real-sglang}; C=.dev/real-sglang
mkdir -p "$W/dl" "$W/whl312" "$C"
PL=""; for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do PL="$PL --platform ${p}_x86_64"; done
DL="python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PL"
$DL -d "$W/dl" sglang==0.5.16 sglang-kernel==0.4.5 flashinfer-python==0.6.14 xgrammar==0.2.1
$DL -d "$W/whl312" $(grep -v '^#' "$HERE/launch-deps.txt")
# site1: sglang, sgl_kernel without FA3 (flash_ops.abi3.so, 1.1 GB unpacked: the launch uses
# --attention-backend triton) and without sm100/ (an H200 is sm90), and FlashInfer.
rm -rf "$W/site1" "$W/site2" && mkdir "$W/site1" "$W/site2"
(cd "$W/site1" && unzip -q "$W"/dl/sglang-0.5.16-*.whl \
  && unzip -q "$W"/dl/sglang_kernel-0.4.5-*.whl -x 'sgl_kernel/flash_ops.abi3.so' 'sgl_kernel/sm100/*' \
  && unzip -q "$W"/dl/flashinfer_python-0.6.14-*.whl 'flashinfer/*' 'flashinfer_python-0.6.14.dist-info/*')
tar cf - -C "$W/site1" . | xz -6 -T2 > "$C/site1.tar.xz"
# site2: the launch dependencies and xgrammar without its 65 MB static library.
(cd "$W/site2" && for w in "$W"/whl312/*.whl "$W"/dl/xgrammar-*.whl; do unzip -q -o "$w"; done \
  && rm -rf xgrammar/lib/libxgrammar.a ./*.data)
tar cf - -C "$W/site2" . | xz -6 -T2 > "$C/site2.tar.xz"
# The tokenizer is trained here (a real byte-level BPE, 32000 tokens); the model is made there.
if [ ! -f "$C/model_src/tokenizer.json" ]; then
  [ -x "$W/venv/bin/python" ] || { python3 -m venv "$W/venv" && "$W/venv/bin/pip" install -q tokenizers==0.22.2; }
  VOCAB=32000 "$W/venv/bin/python" "$HERE/make_tokenizer.py" "$C/model_src"
fi
du -sh "$C"
