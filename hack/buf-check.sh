#!/usr/bin/env bash
# Checks the protobuf API under proto/:
#   1. protoc-gen-go (tools/go.mod) and the main module's protobuf runtime are
#      the same version, so generated code matches the runtime it runs with;
#   2. `buf lint` (STANDARD rules, buf.yaml) passes;
#   3. the committed generated Go code (*.pb.go under proto/) is exactly what
#      `buf generate` produces now: generation goes to a temporary directory
#      and is compared with `diff -r`, so this works in a fresh clone and on
#      files not yet committed, and never touches the work tree.
#
# Tooling is pinned in tools/go.mod and run with `go tool`, so nothing but the
# Go module proxy is needed (and nothing at all once `cd tools && go mod
# download` has run). The first run compiles buf (a few minutes on 2 cores);
# later runs reuse Go's build cache.
#
# Usage: bash hack/buf-check.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" # buf.gen.yaml runs plugins with -modfile=tools/go.mod, relative to the root

buf() { go tool -modfile=tools/go.mod buf "$@"; }
regen_cmd='go tool -modfile=tools/go.mod buf generate'

# 1. Version alignment.
tools_pb="$(go list -modfile=tools/go.mod -m -f '{{.Version}}' google.golang.org/protobuf)"
main_pb="$(go list -m -f '{{.Version}}' google.golang.org/protobuf)"
if [[ "$tools_pb" != "$main_pb" ]]; then
	echo "buf-check: protoc-gen-go in tools/go.mod is google.golang.org/protobuf $tools_pb but the main module uses $main_pb; align them, then run \`$regen_cmd\`" >&2
	exit 1
fi

# 2. Lint.
if ! buf lint; then
	echo "buf-check: buf lint failed (see above)" >&2
	exit 1
fi

# 3. Staleness of the generated code.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/gen" "$tmp/committed"

if ! buf generate -o "$tmp/gen"; then
	echo "buf-check: buf generate failed (see above)" >&2
	exit 1
fi

# Copy the committed generated files (only those: .proto sources and tests are
# not generated) so both trees hold the same kind of files.
while IFS= read -r -d '' f; do
	mkdir -p "$tmp/committed/$(dirname "$f")"
	cp "$f" "$tmp/committed/$f"
done < <(find proto -type f -name '*.pb.go' -print0)
mkdir -p "$tmp/gen/proto" "$tmp/committed/proto"

if ! diff -r -u "$tmp/committed/proto" "$tmp/gen/proto" >"$tmp/diff.txt"; then
	sed -e "s#$tmp/committed/##g" -e "s#$tmp/gen/#regenerated:#g" "$tmp/diff.txt" | head -n 60 >&2
	echo >&2
	echo "buf-check: generated code is stale: run \`$regen_cmd\`" >&2
	exit 1
fi

echo "buf-check: OK (lint passed, generated code up to date, protobuf $main_pb)"
