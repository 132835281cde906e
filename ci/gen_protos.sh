#!/usr/bin/env bash
# Regenerates the committed gRPC stubs in src/danube/proto/ from proto/**/*.proto.
# Run after editing a .proto: bash ci/gen_protos.sh   (needs grpcio-tools==1.85.1)
set -euo pipefail
cd "$(dirname "$0")/.."
out=src/danube/proto
find "$out" -name '*_pb2*.py' -delete
# Each proto package dir becomes danube.proto.<package>; imports are rewritten to be package-relative.
python -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" $(find proto -name '*.proto' | sort)
for f in $(find "$out" -name '*_pb2*.py' -o -name '*_pb2.pyi'); do
  # "from danube_admin import x_pb2" / "import x_pb2" -> package-relative imports
  sed -i -E 's/^from ([a-z_]+) import ([A-Za-z0-9_]+_pb2)/from danube.proto.\1 import \2/; s/^import ([A-Za-z0-9_]+_pb2) as/from . import \1 as/' "$f"
done
find "$out" -type d -exec touch {}/__init__.py \;
echo "stubs regenerated in $out"
