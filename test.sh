#!/usr/bin/env bash
# Runs every test of every module in the repository (each folder with a
# go.mod), under the race detector, after go vet. bench/ also runs its
# benchmark program in quick mode, so it cannot rot; its tables are shown
# only if it fails. Quiet when all is well: the packages' ok lines, then a
# summary.
set -euo pipefail
cd "$(dirname "$0")"
mapfile -t modules < <(find . -name go.mod -not -path './.git/*' -printf '%h\n' | sort)
for dir in "${modules[@]}"; do
	echo "== module $dir"
	(
		cd "$dir"
		go vet ./...
		go test -race -count=1 -timeout 20m ./... 2>&1 | grep -v '^?.*\[no test files\]$'
		exit "${PIPESTATUS[0]}"
	)
done
if [ -f bench/go.mod ]; then
	echo "== bench quick mode"
	out=$(mktemp)
	if ! (cd bench && go run ./cmd/ferrybench -quick) >"$out" 2>&1; then
		cat "$out"
		rm -f "$out"
		echo "bench quick mode failed" >&2
		exit 1
	fi
	rm -f "$out"
	echo "ok  	ferrybench -quick"
fi
echo "all ${#modules[@]} modules passed"
