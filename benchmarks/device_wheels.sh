#!/usr/bin/env bash
# The wheels a device call carries (the H200 image has no fastapi, uvicorn, pydantic, pyzmq, soundfile,
# the openai client ...; its transformers is older than the tests' oracle): downloaded here for the
# device's Python 3.12 into .whl/ (the package's runtime + the openai client) and .whl_hf/ (the tests'
# transformers), less what the image already holds (KINDS.md's package list). PyAV (35 MB) is left out
# (the 64 MiB a call; its two test modules are not collected there). Both folders are git-ignored.
#
#   bash benchmarks/device_wheels.sh          # then: run(..., carry=[".whl", ".whl_hf"])
#
# benchmarks/h200_common.sh's install_wheels installs them on the device (into /tmp/site).
set -euo pipefail
cd "$(dirname "$0")/.."
PLATFORMS=(manylinux1_x86_64 manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64
  manylinux_2_28_x86_64 manylinux_2_34_x86_64)
# on the device image already (as KINDS.md lists them); a wheel of one of these would shadow it
PRESENT="annotated_doc anyio certifi click filelock fsspec h11 hf_xet httpcore httpx huggingface_hub idna jinja2
  markdown_it_py markupsafe mdurl msgpack numpy packaging pillow prometheus_client pygments pyyaml regex requests
  rich safetensors shellingham tokenizers tqdm typer typing_extensions urllib3 zipp"

download() {  # DIR SPEC...
  local dir=$1; shift
  rm -rf "$dir" && mkdir -p "$dir"
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]/#/--platform=}" -d "$dir" "$@"
  for name in $PRESENT; do rm -f "$dir/$name"-[0-9]*.whl; done
  echo "$dir: $(ls "$dir" | wc -l) wheels, $(du -sh "$dir" | cut -f1)"
}

download .whl "fastapi>=0.110" "pydantic>=2.6" "uvicorn>=0.29" "websockets>=13,<16" "webrtcvad-wheels>=2.0.11,<3" \
  "soundfile>=0.13,<1" "soxr>=0.5,<2" "pyzmq>=25" "openai[realtime]>=2" opentelemetry-api
download .whl_hf "transformers==5.24.0"
for wheel in .whl/*.whl; do rm -f ".whl_hf/$(basename "$wheel")"; done  # (one copy of each: two stop the install)
echo ".whl_hf without .whl's: $(ls .whl_hf | tr '\n' ' ')"
