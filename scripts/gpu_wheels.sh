#!/usr/bin/env bash
# On a machine that reaches PyPI (after scripts/setup.sh --test): put into .whl/ the wheels that an x86_64
# GPU machine with its own PyTorch, torchvision, Lightning and timm (and no package registry) lacks for
# phalanx and its tests, for that machine's Python (default 3.12; PY=3.11 for another), and visdom's
# page assets. Then copy the checkout with .whl/ there and run scripts/gpu_setup.sh.
#
# The list is what .venv holds beyond such an image (the pins are .venv's versions on 2026-11-24):
# boto3, pycocotools and zarr for phalanx (not imagecodecs: 26 MB, and tifffile writes and reads phalanx's zlib
# tiles with Python's zlib); moto's S3 server, lightly and visdom's server for the
# tests; DeepLIIF 1.2.7's files (the reference of tests/test_deepliif.py) in .whl/deepliif/ of their own.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PY:-3.12}
mkdir -p .whl
WHEELS=(annotated-types==0.8.0 aws-xray-sdk==2.15.0 blinker==1.9.0 boto3==1.44.5 botocore==1.44.5 cffi==2.1.1
  cfn-lint==1.58.0 cryptography==50.0.2 docker==7.2.0 donfig==0.8.1.post1 google-crc32c==1.9.0
  numcodecs==0.16.6 zarr==3.1.6 Flask==3.1.3 flask-cors==6.0.5 graphql-core==3.3.2
  httpcore2==2.16.2 httpx2==2.16.2 hydra-core==1.3.8 itsdangerous==2.2.0 jmespath==1.1.0 joserfc==1.8.0
  jsonpatch==1.47 jsonpath-ng==1.16.0 jsonpointer==3.12 jsonschema==4.26.0 jsonschema-path==0.5.0
  jsonschema-specifications==2025.9.1 lazy-object-proxy==1.13.0 lightly==1.6.0 moto==5.2.5 omegaconf==2.3.1
  openapi-schema-validator==0.9.0 openapi-spec-validator==0.9.0 pathable==0.6.0 py-partiql-parser==0.6.3
  pycocotools==2.0.11 pycparser==3.12 pydantic==2.14.3 pydantic_core==2.50.4 pydantic-settings==2.16.3
  python-dotenv==1.2.4 referencing==0.37.0 responses==0.26.3 rfc3339-validator==0.1.4 rpds-py==2026.9.1
  s3transfer==0.19.3 tornado==6.5.10 truststore==0.10.5 typing-inspection==0.4.5 websocket-client==1.9.2
  xmltodict==1.0.4)
platforms=()
for p in manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any; do platforms+=(--platform "$p"); done
PIP_CONSTRAINT= .venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version "$py" \
  --implementation cp "${platforms[@]}" -d .whl "${WHEELS[@]}"
# DeepLIIF's own pins want another torch: its files alone, installed apart by gpu_setup.sh.
PIP_CONSTRAINT= .venv/bin/python -m pip download --quiet --no-deps -d .whl/deepliif deepliif==1.2.7
# Two packages publish only source: build their (pure-Python) wheels here.
.venv/bin/python -m pip wheel --quiet --no-deps -w .whl visdom==0.2.4 antlr4-python3-runtime==4.9.3
# visdom's page assets, fetched from npm by scripts/setup.sh (python -m phalanx.visualize.assets).
static=$(.venv/bin/python -c "import visdom, os; print(os.path.join(os.path.dirname(visdom.__file__), 'static'))")
tar -czf .whl/visdom-static.tar.gz -C "$static" .
echo "gpu_wheels.sh: $(ls .whl/*.whl | wc -l) wheels and visdom's assets in .whl ($(du -sh .whl | cut -f1))"
