#!/usr/bin/env bash
# Runs every test of every module in the repository, under the race detector.
set -euo pipefail
cd "$(dirname "$0")"
for mod in $(find . -name go.mod -not -path './.git/*' | sort); do
	dir=$(dirname "$mod")
	echo "== $dir"
	(cd "$dir" && go vet ./... && go test -race -count=1 -timeout 15m ./...)
done
