#!/usr/bin/env bash
# Runs every test of every module in the repository (each folder with a
# go.mod), under the race detector, after go vet. bench/ also runs its
# benchmark program in quick mode, so it cannot rot.
set -euo pipefail
cd "$(dirname "$0")"
mapfile -t modules < <(find . -name go.mod -not -path './.git/*' -printf '%h\n' | sort)
for dir in "${modules[@]}"; do
	echo "== module $dir"
	(
		cd "$dir"
		go vet ./...
		go test -race -count=1 -timeout 20m ./...
	)
done
if [ -f bench/go.mod ]; then
	echo "== bench quick mode"
	(cd bench && go run ./cmd/ferrybench -quick)
fi
